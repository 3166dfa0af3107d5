ALTER TABLE runner_gateway DROP COLUMN orphaned_at;
ALTER TABLE runner_command DROP COLUMN owner_counter;
DROP INDEX job_turn_by_connection;
ALTER TABLE job_turn DROP COLUMN runtime_session_id;
ALTER TABLE job_turn DROP COLUMN first_seq;
ALTER TABLE job_turn DROP COLUMN connection_id;
