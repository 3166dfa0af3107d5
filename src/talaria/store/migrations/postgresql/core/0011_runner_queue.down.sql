DROP TABLE runner_command;
DROP TABLE runner_seen;
DROP TABLE runner_retired;
DROP TABLE runner_conn;
