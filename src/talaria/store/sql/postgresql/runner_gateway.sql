-- name: runner_gateway_insert
-- A hub-side gateway of a live state, before its gateway.open is sent; 0 rows when the state ended meanwhile.
INSERT INTO runner_gateway (id, runner_id, epoch, account_username, account_tenant, auth_version, cleanup_only,
                            owner_replica, opened_at)
SELECT :id, :runner_id, :epoch, :account_username, :account_tenant, :auth_version, :cleanup_only, :owner_replica, :now
WHERE EXISTS (SELECT 1 FROM runner_conn WHERE epoch = :epoch)
RETURNING id

-- name: runner_gateway_get
-- An open gateway of a state, as admit and event read it.
SELECT id, account_username, account_tenant, auth_version, cleanup_only, owner_replica
FROM runner_gateway WHERE id = :id AND epoch = :epoch AND closed_at IS NULL

-- name: runner_gateway_lock
-- A gateway of a state while an event post is stored (the seq check and the frame in one transaction).
SELECT id, owner_replica, last_seq, closed_at FROM runner_gateway WHERE id = :id AND epoch = :epoch FOR UPDATE

-- name: runner_gateway_advance
-- An event stored: the gateway's last seq.
UPDATE runner_gateway SET last_seq = :seq WHERE id = :id

-- name: runner_gateway_close
-- A gateway closed on the hub side or by the runner's close marker: closed once, with a close marker at the next seq
-- (the runner's own marker, when it sent one, is stored by the caller first). With a counter, only while the gateway's
-- owner counter is that one (an owner it was adopted from closes nothing).
WITH closed AS (
    UPDATE runner_gateway
    SET closed_at = :now, revoked = revoked OR :revoked,
        last_seq = CASE WHEN :marked THEN last_seq ELSE last_seq + 1 END
    WHERE id = :id AND closed_at IS NULL AND (:counter IS NULL OR owner_counter = :counter)
    RETURNING id, last_seq, owner_replica
), marker AS (
    INSERT INTO runner_event (connection_id, seq, frame, closed)
    SELECT id, last_seq, NULL, TRUE FROM closed WHERE NOT :marked
)
SELECT id, owner_replica FROM closed

-- name: runner_gateway_close_epoch
-- A state ended: its open gateways close, each with a close marker.
WITH closed AS (
    UPDATE runner_gateway SET closed_at = :now, last_seq = last_seq + 1
    WHERE epoch = :epoch AND closed_at IS NULL
    RETURNING id, last_seq
)
INSERT INTO runner_event (connection_id, seq, frame, closed)
SELECT id, last_seq, NULL, TRUE FROM closed

-- name: runner_gateway_revoke
-- A check found the gateway's account without access: its owner stops the turn when the gateway ends.
UPDATE runner_gateway SET revoked = TRUE WHERE id = :id AND epoch = :epoch

-- name: runner_gateway_progress
-- The fallback of the event channel (scale.md 3.3): for the gateways this replica owns, how far their frames go and
-- whether another replica adopted one.
SELECT id, last_seq, closed_at, owner_counter FROM runner_gateway WHERE id = ANY(:ids)

-- name: runner_gateway_counter
-- A gateway's owner counter (open or closed), checked when a command is queued on it.
SELECT owner_counter FROM runner_gateway WHERE id = :id

-- name: runner_gateway_adopt
-- A new owner takes over an open gateway of the runner's current state for a job it holds (scale.md 4.4 step 3):
-- owner counter + 1, no longer an orphan. Only while the job is held under the given lease.
UPDATE runner_gateway g
SET owner_replica = :replica, owner_counter = g.owner_counter + 1, orphaned_at = NULL
FROM runner_conn c
WHERE g.id = :id AND g.runner_id = :runner_id AND g.closed_at IS NULL AND NOT g.cleanup_only
  AND c.runner_id = g.runner_id AND c.epoch = g.epoch
  AND EXISTS (SELECT 1 FROM hermes_job j WHERE j.id = :job_id AND j.lease_id = :lease_id
                                          AND j.lease_epoch = :lease_epoch FOR SHARE)
RETURNING g.id, g.epoch, g.owner_counter, g.last_seq

-- name: runner_gateway_adopt_turn
-- As runner_gateway_adopt, for a chat turn (scale.md 4.4: chat turns alike): only while this replica holds the turn's
-- turn_lease at that counter and the turn is still live.
UPDATE runner_gateway g
SET owner_replica = :replica, owner_counter = g.owner_counter + 1, orphaned_at = NULL
FROM runner_conn c
WHERE g.id = :id AND g.runner_id = :runner_id AND g.closed_at IS NULL AND NOT g.cleanup_only
  AND c.runner_id = g.runner_id AND c.epoch = g.epoch
  AND EXISTS (SELECT 1 FROM turn_lease l JOIN chat_turn t ON t.id = l.turn_id
              WHERE l.turn_id = :turn_id AND l.holder = :holder AND l.counter = :counter
                AND t.state IN ('running', 'recovering') FOR SHARE OF l)
RETURNING g.id, g.epoch, g.owner_counter, g.last_seq

-- name: runner_gateway_mark_orphans
-- Maintenance: open gateways whose owner replica is not live are orphans from now on (scale.md 4.4 step 5), except
-- the channel of a job turn whose job is not terminal yet, or of a chat turn not ended (its next owner adopts it).
UPDATE runner_gateway g SET orphaned_at = :now
WHERE g.closed_at IS NULL AND g.orphaned_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM hub_replica r WHERE r.id = g.owner_replica AND r.renewed_at > :live_since)
  AND NOT EXISTS (SELECT 1 FROM job_turn t JOIN hermes_job j ON j.id = t.job_id
                  WHERE t.connection_id = g.id AND j.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))
  AND NOT EXISTS (SELECT 1 FROM chat_turn t WHERE t.connection_id = g.id AND t.state IN ('running', 'recovering'))

-- name: runner_gateway_orphans
-- Maintenance: orphans nothing adopted within 60 s, to be closed (a few at a time).
SELECT g.id, g.runner_id, g.epoch, g.owner_counter, g.account_username, g.account_tenant, g.auth_version
FROM runner_gateway g
WHERE g.closed_at IS NULL AND g.orphaned_at < :before
ORDER BY g.orphaned_at LIMIT 50

-- name: runner_gateway_prune
-- Frames are kept 1 h after their gateway closed (scale.md 3.1); the gateway row goes with them.
DELETE FROM runner_gateway WHERE closed_at < :before
