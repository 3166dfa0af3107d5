-- name: account_insert
-- Create an account; no row when the name is taken (a concurrent create included).
INSERT INTO account (username, tenant, role, password_hash, enabled, allowed_profiles, can_manage_team,
                     auth_version, created_at, updated_at)
VALUES (:username, :tenant, :role, :password_hash, 1, :allowed_profiles, :can_manage_team, 1, :now, :now)
ON CONFLICT (username) DO NOTHING
RETURNING username

-- name: account_get
-- One account by username (usernames are unique across tenants).
SELECT * FROM account WHERE username = :username

-- name: account_list
-- Accounts of a tenant, newest first, after a (created_at, username) cursor.
SELECT * FROM account
WHERE tenant = :tenant
  AND (:cursor_at IS NULL OR created_at < :cursor_at OR (created_at = :cursor_at AND username < :cursor_id))
ORDER BY created_at DESC, username DESC
LIMIT :limit

-- name: account_update
-- Replace the mutable fields of an account, bumping nothing itself (the caller sets auth_version).
UPDATE account SET role = :role, password_hash = :password_hash, enabled = :enabled,
    allowed_profiles = :allowed_profiles, can_manage_team = :can_manage_team,
    auth_version = :auth_version, updated_at = :now
WHERE username = :username AND auth_version = :expected_auth_version

-- name: account_count_other_enabled_admins
-- How many enabled admins the tenant has besides this account (the last one may not leave, web-api.md 3).
SELECT COUNT(*) AS n FROM account WHERE tenant = :tenant AND role = 'admin' AND enabled = 1 AND username <> :username

-- name: account_lock
-- Hold an account's row for the rest of the transaction (scale.md 3.7): writes that count what the account has
-- (live turns, bots, conversations, attachments) and insert one more are serialised per account across replicas.
SELECT username FROM account WHERE username = :username
