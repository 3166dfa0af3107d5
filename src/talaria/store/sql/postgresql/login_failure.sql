-- name: login_failure_recent
-- A key's newest failures within the window, newest first, at most :limit.
SELECT at FROM login_failure WHERE key = :key AND at > :since ORDER BY at DESC LIMIT :limit

-- name: login_failure_insert
-- One failed sign-in for a key (an account's or a peer's digest).
INSERT INTO login_failure (key, at) VALUES (:key, :at)

-- name: login_failure_prune
-- Failures older than the window count for nothing any more.
DELETE FROM login_failure WHERE at <= :before

-- name: login_failure_forget
-- A successful sign-in forgets the account's failures (not its peer's).
DELETE FROM login_failure WHERE key = :key
