-- name: runner_command_load
-- The pending commands of a state (the 64 / 64 MiB limits), counted under its row lock.
SELECT COUNT(*) AS n, COALESCE(SUM(size), 0) AS bytes FROM runner_command
WHERE epoch = :epoch AND outcome IS NULL AND expires_at > :now

-- name: runner_command_insert
-- A command joins the queue of a state.
INSERT INTO runner_command (id, runner_id, epoch, kind, wire, size, enqueued_at, expires_at, account_username,
                            account_tenant, auth_version, profile, connection_id, grant_id, sender_replica,
                            owner_counter)
VALUES (:id, :runner_id, :epoch, :kind, :wire, :size, :now, :expires_at, :account_username, :account_tenant,
        :auth_version, :profile, :connection_id, :grant_id, :sender_replica, :owner_counter)

-- name: runner_command_due
-- A poll's batch candidates: pending, due and unexpired, in enqueue order (the 38 MiB cut is the caller's).
SELECT id, wire, size FROM runner_command
WHERE epoch = :epoch AND outcome IS NULL AND next_delivery <= :now AND expires_at > :now
ORDER BY pos LIMIT 64

-- name: runner_command_next_due
-- When the next pending command of a state is due again (a poll holds no longer).
SELECT MIN(next_delivery) AS at FROM runner_command
WHERE epoch = :epoch AND outcome IS NULL AND next_delivery > :now AND expires_at > :now

-- name: runner_command_deliver
-- The commands taken by a poll: delivered once more, due again in 5 s.
UPDATE runner_command SET delivered = delivered + 1, next_delivery = :again
WHERE id = ANY(:ids) AND outcome IS NULL

-- name: runner_command_pending
-- A pending command of a state, for admit, with whether it was sent on a gateway under an owner counter the gateway
-- no longer has (adopted since: scale.md 4.3).
SELECT c.id, c.kind, c.wire, c.expires_at, c.account_username, c.account_tenant, c.auth_version, c.profile,
       c.connection_id, c.grant_id,
       (c.owner_counter IS NOT NULL AND g.owner_counter IS DISTINCT FROM c.owner_counter) AS stale_owner
FROM runner_command c LEFT JOIN runner_gateway g ON g.id = c.connection_id
WHERE c.id = :id AND c.epoch = :epoch AND c.outcome IS NULL

-- name: runner_command_of_previous_owner
-- Whether a command sent on a gateway under an earlier owner counter is still pending and unexpired (an adopting
-- owner waits for none to be left: scale.md 4.4 step 3).
SELECT 1 AS pending FROM runner_command
WHERE connection_id = :connection_id AND outcome IS NULL AND expires_at > :now
  AND owner_counter IS NOT NULL AND owner_counter < :counter
LIMIT 1

-- name: runner_command_settle
-- A command's one outcome (a result post, a deadline, a closed gateway): only while none is set, and only for the
-- state it was queued for; the sender's replica comes back so it can be woken.
UPDATE runner_command SET outcome = :outcome, outcome_body = :body, settled_at = :now
WHERE id = :id AND epoch = :epoch AND outcome IS NULL
RETURNING id, sender_replica

-- name: runner_command_lost
-- A deadline passed: never delivered is offline, delivered is uncertain.
UPDATE runner_command
SET outcome = CASE WHEN delivered = 0 THEN 'offline' ELSE 'uncertain' END, settled_at = :now
WHERE id = :id AND outcome IS NULL
RETURNING id, sender_replica

-- name: runner_command_end_state
-- A state ended: every pending command of it is settled by whether it was delivered.
UPDATE runner_command
SET outcome = CASE WHEN delivered = 0 THEN 'offline' ELSE 'uncertain' END, settled_at = :now
WHERE epoch = :epoch AND outcome IS NULL
RETURNING id, sender_replica

-- name: runner_command_expire
-- Maintenance: commands well past their deadline whose sender is gone are settled by whether they were delivered.
UPDATE runner_command
SET outcome = CASE WHEN delivered = 0 THEN 'offline' ELSE 'uncertain' END, settled_at = :now
WHERE outcome IS NULL AND expires_at < :before
RETURNING id, sender_replica

-- name: runner_command_close_gateway
-- A gateway closed on the hub side: its pending commands (but its own close) fail closed.
UPDATE runner_command SET outcome = 'closed', settled_at = :now
WHERE connection_id = :connection_id AND kind <> 'gateway.close' AND outcome IS NULL
RETURNING id, sender_replica

-- name: runner_command_outcome
-- A command's outcome, once set.
SELECT outcome, outcome_body, delivered FROM runner_command WHERE id = :id

-- name: runner_command_outcomes
-- The fallback of the command channel: which of the commands this replica waits on are settled, and when.
SELECT id, settled_at FROM runner_command WHERE id = ANY(:ids) AND outcome IS NOT NULL

-- name: runner_command_wires
-- The wire form of a state's pending commands in enqueue order (tests and views).
SELECT wire FROM runner_command WHERE epoch = :epoch AND outcome IS NULL ORDER BY pos

-- name: runner_command_pending_count
-- The commands pending in the cluster (the gauge).
SELECT COUNT(*) AS n FROM runner_command WHERE outcome IS NULL

-- name: runner_command_abandon
-- A stopping replica settles the commands it sent: nobody waits for them any more (taken ones may have run).
UPDATE runner_command SET outcome = CASE WHEN delivered = 0 THEN 'offline' ELSE 'uncertain' END, settled_at = :now
WHERE sender_replica = :replica AND outcome IS NULL

-- name: runner_command_prune
-- Settled commands are kept 10 minutes (scale.md 3.1).
DELETE FROM runner_command WHERE outcome IS NOT NULL AND settled_at < :before
