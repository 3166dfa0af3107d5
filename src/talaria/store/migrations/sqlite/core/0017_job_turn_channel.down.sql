DROP INDEX job_turn_by_connection;
ALTER TABLE job_turn DROP COLUMN runtime_session_id;
ALTER TABLE job_turn DROP COLUMN first_seq;
ALTER TABLE job_turn DROP COLUMN connection_id;
