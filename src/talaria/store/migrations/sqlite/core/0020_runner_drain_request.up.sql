-- additive: true
-- `talaria admin runners drain` records its request on the runner row: the command line cannot reach the hub's
-- memory, so the hub applies it at the runner's next request if the connection state is older, else drops it
-- (operations.md 3.1).
ALTER TABLE runner ADD COLUMN drain_requested_at INTEGER;
