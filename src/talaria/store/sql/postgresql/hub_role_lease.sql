-- name: hub_role_lease_take
-- Take or renew a role (scale.md 3.6): when it is free, expired or already mine; the counter grows on each take.
UPDATE hub_role_lease
SET counter = CASE WHEN holder = :holder AND expires_at > :now THEN counter ELSE counter + 1 END,
    holder = :holder, expires_at = :expires_at
WHERE role = :role AND (holder IS NULL OR holder = :holder OR expires_at <= :now)
RETURNING counter

-- name: hub_role_lease_release
-- A stopping replica lets go of what it holds.
UPDATE hub_role_lease SET holder = NULL, expires_at = 0 WHERE holder = :holder

-- name: hub_role_lease_list
-- Every role with its holder, counter and expiry.
SELECT role, holder, counter, expires_at FROM hub_role_lease ORDER BY role
