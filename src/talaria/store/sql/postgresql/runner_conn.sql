-- name: runner_conn_lock
-- Gates 3-8 and every change of a connection state run holding its row (scale.md 3.3).
SELECT runner_id, instance, epoch, created_at, seen_at, features, runner_version, poll_token, poll_replica,
       draining_since
FROM runner_conn WHERE runner_id = :runner_id FOR UPDATE

-- name: runner_conn_poll_lock
-- One runner's polls, one at a time, before its row (ADR 0068): a poll that replaces the state deletes the row the
-- next one waits for, which would then find no row and lose its insert to a third. Key: (7346298, the runner id's
-- hash), in the two-int space of advisory locks, apart from the one-bigint keys (chat_turn_limit_lock, migrations);
-- two runners whose ids share a hash only wait for each other's polls.
SELECT pg_advisory_xact_lock(7346298, hashtext(:runner_id)) AS locked

-- name: runner_conn_get
-- One runner's connection state, read without a lock.
SELECT runner_id, instance, epoch, created_at, seen_at, features, runner_version, poll_token, poll_replica,
       draining_since
FROM runner_conn WHERE runner_id = :runner_id

-- name: runner_conn_insert
-- A poll with no state makes one (holding runner_conn_poll_lock, so no other poll can make it first).
INSERT INTO runner_conn (runner_id, instance, epoch, created_at, seen_at, features, runner_version, poll_token,
                         poll_replica)
VALUES (:runner_id, :instance, :epoch, :now, :now, :features, :runner_version, :poll_token, :poll_replica)
ON CONFLICT (runner_id) DO NOTHING
RETURNING runner_id

-- name: runner_conn_touch
-- A request passed gate 8: seen (written at most once a second), features and the runner's version when the
-- features header came (a poll), the poll token.
UPDATE runner_conn
SET seen_at = CASE WHEN :now - seen_at >= 1000 THEN :now ELSE seen_at END,
    features = COALESCE(:features, features),
    runner_version = CASE WHEN :features IS NULL THEN runner_version ELSE :runner_version END,
    poll_token = COALESCE(:poll_token, poll_token),
    poll_replica = COALESCE(:poll_replica, poll_replica)
WHERE runner_id = :runner_id
  AND (:now - seen_at >= 1000 OR :features IS NOT NULL OR :poll_token IS NOT NULL OR :poll_replica IS NOT NULL)

-- name: runner_conn_delete
-- A state ends (reset, goodbye, replaced, disabled, watchdog): by epoch, so a newer state is never ended.
DELETE FROM runner_conn WHERE runner_id = :runner_id AND epoch = :epoch

-- name: runner_conn_unseen
-- The watchdog's candidates: states not seen since :before.
SELECT runner_id, epoch FROM runner_conn WHERE seen_at < :before ORDER BY seen_at LIMIT 1000

-- name: runner_conn_lock_unseen
-- One candidate, still unseen and of the same epoch; skipped while a request holds it.
SELECT runner_id, epoch FROM runner_conn
WHERE runner_id = :runner_id AND epoch = :epoch AND seen_at < :before
FOR UPDATE SKIP LOCKED

-- name: runner_conn_ids
-- The runners with a connection state.
SELECT runner_id FROM runner_conn ORDER BY runner_id

-- name: runner_conn_count
-- The runners with a connection state (the gauge).
SELECT COUNT(*) AS n FROM runner_conn

-- name: runner_conn_watch
-- The fallback of the runner channel (scale.md 3.3): for the runners this replica waits on, their state's epoch
-- and poll token and since when a command is due (null: none); one query for every waiter.
SELECT r.id AS runner_id, c.epoch, c.poll_token,
       (SELECT MIN(GREATEST(q.next_delivery, q.enqueued_at)) FROM runner_command q WHERE q.epoch = c.epoch
        AND q.outcome IS NULL AND q.next_delivery <= :now AND q.expires_at > :now) AS due_since
FROM runner r LEFT JOIN runner_conn c ON c.runner_id = r.id
WHERE r.id = ANY(:runner_ids)

-- name: runner_conn_summary
-- What the nodes page shows of a runner's connection.
SELECT c.created_at, c.seen_at, c.features, c.runner_version, c.draining_since, s.seen_at AS last_seen_at
FROM runner r LEFT JOIN runner_conn c ON c.runner_id = r.id LEFT JOIN runner_seen s ON s.runner_id = r.id
WHERE r.id = :runner_id

-- name: runner_conn_seen
-- The last request that passed gate 8, kept after the state ends.
INSERT INTO runner_seen (runner_id, seen_at) VALUES (:runner_id, :now)
ON CONFLICT (runner_id) DO UPDATE SET seen_at = EXCLUDED.seen_at
WHERE runner_seen.seen_at <= EXCLUDED.seen_at - 1000

-- name: runner_conn_retired
-- Whether an instance was replaced (gate 6), and how many were.
SELECT EXISTS (SELECT 1 FROM runner_retired WHERE runner_id = :runner_id AND instance = :instance) AS retired,
       (SELECT COUNT(*) FROM runner_retired WHERE runner_id = :runner_id) AS n

-- name: runner_conn_retire
-- An instance replaced by another one is remembered (gate 6).
INSERT INTO runner_retired (runner_id, instance, retired_at) VALUES (:runner_id, :instance, :now)
ON CONFLICT DO NOTHING

-- name: runner_conn_prune_retired
-- Replaced instances are remembered 24 h.
DELETE FROM runner_retired WHERE retired_at < :before

-- name: runner_conn_drain
-- A runner says it drains (X-Runner-Draining, operations.md 3.1): its state of this epoch drains from now on.
UPDATE runner_conn SET draining_since = :now
WHERE runner_id = :runner_id AND epoch = :epoch AND draining_since IS NULL

-- name: runner_conn_drain_current
-- An admin drains the runner's current state (operations.md 3.1); its drain began at draining_since (a repeat
-- changes nothing). No row: the runner is not connected.
UPDATE runner_conn SET draining_since = COALESCE(draining_since, :now)
WHERE runner_id = :runner_id
RETURNING epoch, poll_replica, draining_since

-- name: runner_conn_wake
-- Wake the replica holding the runner's poll (the command line has no listener of its own).
SELECT pg_notify('talaria_runner', :runner_id) AS sent

-- name: runner_conn_draining_count
-- Connection states that drain (talaria_runners_draining).
SELECT COUNT(*) AS n FROM runner_conn WHERE draining_since IS NOT NULL

-- name: runner_conn_drop_events
-- A restore drops the runners' operational state (scale.md 3.1), children first: accepted Hermes frames.
DELETE FROM runner_event

-- name: runner_conn_drop_tool_calls
-- A restore: tool calls of grants.
DELETE FROM runner_tool_call

-- name: runner_conn_drop_gateways
-- A restore: hub-side gateway channels.
DELETE FROM runner_gateway

-- name: runner_conn_drop_grants
-- A restore: hub-side grants.
DELETE FROM runner_grant

-- name: runner_conn_drop_commands
-- A restore: the command queue.
DELETE FROM runner_command

-- name: runner_conn_drop_retired
-- A restore: gate 6's retired instances.
DELETE FROM runner_retired

-- name: runner_conn_drop_all
-- A restore: the connection states last; every runner gets a new epoch at its next poll.
DELETE FROM runner_conn
