-- additive: true
-- Adoption of a dead owner's channel (scale.md 2.5, 4.3, 4.4; ADR 0055). A job's turn records the gateway channel it
-- runs in: connection_id, the first event number of the turn on it (first_seq) and the session's runtime id, so
-- that the replica taking the job over adopts the channel (owner counter + 1) and replays its frames. A command on
-- a gateway carries the owner counter it was sent under: enqueue and admit refuse it once the counter moved on.
ALTER TABLE job_turn ADD COLUMN connection_id TEXT COLLATE "C";
ALTER TABLE job_turn ADD COLUMN first_seq BIGINT;
ALTER TABLE job_turn ADD COLUMN runtime_session_id TEXT COLLATE "C";
CREATE INDEX job_turn_by_connection ON job_turn(connection_id) WHERE connection_id IS NOT NULL;
ALTER TABLE runner_command ADD COLUMN owner_counter BIGINT;
-- when maintenance found the gateway's owner replica no longer live (nothing adopting it within 60 s closes it)
ALTER TABLE runner_gateway ADD COLUMN orphaned_at BIGINT;
