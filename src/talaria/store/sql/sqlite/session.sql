-- name: session_insert
-- Start a web session (the id is stored as its SHA-256) while the account is enabled and at :auth_version, the one
-- whose password was checked: 0 rows once a change has ended its sessions (the account row is read locked, so a
-- change in flight is waited for).
INSERT INTO web_session (id_hash, username, csrf_token, auth_version, created_at, last_seen_at)
SELECT :id_hash, :username, :csrf_token, :auth_version, :now, :now
FROM account WHERE username = :username AND auth_version = :auth_version AND enabled = 1

-- name: session_get
-- A web session with its account's current state.
SELECT s.id_hash, s.username, s.csrf_token, s.auth_version AS session_auth_version, s.created_at,
       s.last_seen_at, a.tenant, a.role, a.enabled, a.auth_version, a.allowed_profiles, a.can_manage_team
FROM web_session s JOIN account a ON a.username = s.username
WHERE s.id_hash = :id_hash

-- name: session_touch
-- Record activity on a session (idle expiry counts from here).
UPDATE web_session SET last_seen_at = :now WHERE id_hash = :id_hash

-- name: session_delete
-- End one session.
DELETE FROM web_session WHERE id_hash = :id_hash

-- name: session_delete_for_user
-- End every session of an account (disable, role or password change).
DELETE FROM web_session WHERE username = :username

-- name: session_delete_for_user_but
-- End every session of an account but one (the person changed their own password in that one).
DELETE FROM web_session WHERE username = :username AND id_hash <> :kept

-- name: session_prune
-- Remove sessions past their idle or absolute lifetime.
DELETE FROM web_session WHERE last_seen_at <= :idle_before OR created_at <= :created_before

-- name: session_delete_all
-- A restore ends every web session (operations.md 7.2).
DELETE FROM web_session
