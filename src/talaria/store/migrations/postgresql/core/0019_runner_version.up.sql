-- additive: true
-- A connection state records the runner's release from the User-Agent of its polls (operations.md 1.2), shown
-- as runnerVersion while the runner is connected.
ALTER TABLE runner_conn ADD COLUMN runner_version TEXT COLLATE "C";
