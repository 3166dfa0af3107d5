-- additive: false
-- The job's turn record becomes an explicit state machine (issue 11, defect 9): a finished turn keeps its
-- outcome and reply, so that an attempt after a hub crash between "turn finished" and the job's terminal
-- commit finishes the job from the record instead of opening another Hermes session.
-- Not additive: the new CHECK refuses a finished turn without an outcome, which the previous release writes.
-- SQLite rebuilds the table (its ALTER cannot add a table CHECK); here the columns and checks are added in place
-- (so outcome and reply come after updated_at in the column order; rows are read by name).
ALTER TABLE job_turn ADD COLUMN outcome TEXT COLLATE "C"
    CONSTRAINT job_turn_outcome_check CHECK (outcome IN ('complete', 'error', 'interrupted', 'timeout'));
ALTER TABLE job_turn ADD COLUMN reply TEXT COLLATE "C";
-- a turn finished before this migration left no outcome: treat it as uncertain (never resubmitted)
UPDATE job_turn SET outcome = 'interrupted' WHERE state = 'finished';
ALTER TABLE job_turn ADD CONSTRAINT job_turn_finished_has_outcome CHECK ((state = 'finished') = (outcome IS NOT NULL));
ALTER TABLE job_turn ADD CONSTRAINT job_turn_reply_only_finished CHECK (reply IS NULL OR state = 'finished');
