-- additive: true
-- `talaria admin runners drain` on a SQLite hub records its request on the runner row, applied at the runner's next
-- request (operations.md 3.1). A PostgreSQL command line drains the state row itself (runner_conn.draining_since);
-- the column keeps the shared table alike in both dialects.
ALTER TABLE runner ADD COLUMN drain_requested_at BIGINT;
