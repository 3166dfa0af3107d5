ALTER TABLE job_turn DROP CONSTRAINT job_turn_reply_only_finished;
ALTER TABLE job_turn DROP CONSTRAINT job_turn_finished_has_outcome;
ALTER TABLE job_turn DROP COLUMN reply;
ALTER TABLE job_turn DROP COLUMN outcome;
