ALTER TABLE runner_conn DROP COLUMN runner_version;
