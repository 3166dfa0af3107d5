-- additive: true
-- A job's turn records the gateway channel it runs in (scale.md 2.5, 4.4): connection_id, the first event number of
-- the turn on it (first_seq) and the session's runtime id, so that a PostgreSQL replica taking the job over from a
-- dead owner adopts that channel instead of opening a second one. A SQLite hub's channels die with it; the columns
-- keep the shared table alike in both dialects.
ALTER TABLE job_turn ADD COLUMN connection_id TEXT;
ALTER TABLE job_turn ADD COLUMN first_seq INTEGER;
ALTER TABLE job_turn ADD COLUMN runtime_session_id TEXT;
CREATE INDEX job_turn_by_connection ON job_turn(connection_id) WHERE connection_id IS NOT NULL;
