-- name: runner_grant_insert
-- A hub-side tool grant of a live state, before its grant.create is sent; 0 rows when the state ended meanwhile.
INSERT INTO runner_grant (id, runner_id, epoch, account_username, account_tenant, auth_version, profile, work_id,
                          owner_replica, opened_at)
SELECT :id, :runner_id, :epoch, :account_username, :account_tenant, :auth_version, :profile, :work_id,
       :owner_replica, :now
WHERE EXISTS (SELECT 1 FROM runner_conn WHERE epoch = :epoch)
RETURNING id

-- name: runner_grant_get
-- An open grant of a state, as admit and tool read it.
SELECT id, account_username, account_tenant, auth_version, profile, owner_replica, tools, revoked
FROM runner_grant WHERE id = :id AND epoch = :epoch AND closed_at IS NULL

-- name: runner_grant_lock
-- An open grant while one of its calls begins (the 128-call limit, one run per callId).
SELECT id FROM runner_grant WHERE id = :id AND closed_at IS NULL FOR UPDATE

-- name: runner_grant_describe
-- What runs the grant's calls on any replica, set by its owner once the grant's round is captured.
UPDATE runner_grant SET tools = :tools WHERE id = :id

-- name: runner_grant_revoke
-- A check found the grant's account without access: no further call runs; its owner stops the turn.
UPDATE runner_grant SET revoked = TRUE WHERE id = :id

-- name: runner_grant_state
-- Whether the grants this replica owns are still open and unrevoked (the tool channel's fallback).
SELECT id, closed_at, revoked FROM runner_grant WHERE id = ANY(:ids)

-- name: runner_grant_close
-- A grant closed on the hub side; its owner replica comes back when it was open.
UPDATE runner_grant SET closed_at = :now WHERE id = :id AND closed_at IS NULL
RETURNING owner_replica

-- name: runner_grant_close_epoch
-- A state ended: its open grants close.
UPDATE runner_grant SET closed_at = :now WHERE epoch = :epoch AND closed_at IS NULL

-- name: runner_grant_prune
-- Closed grants are kept 1 h.
DELETE FROM runner_grant WHERE closed_at < :before
