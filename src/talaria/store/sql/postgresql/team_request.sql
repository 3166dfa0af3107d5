-- name: team_request_get
-- A requestId's stored answer (team-tools.md 6.1), live or expired.
SELECT * FROM team_request WHERE tenant = :tenant AND owner = :owner AND request_hash = :request_hash

-- name: team_request_put
-- Keep an applied call's answer under its requestId; an expired entry of the same key is replaced.
INSERT INTO team_request (tenant, owner, request_hash, fingerprint, tool, bot_id, result, created_at, expires_at)
VALUES (:tenant, :owner, :request_hash, :fingerprint, :tool, :bot_id, :result, :now, :expires_at)
ON CONFLICT (tenant, owner, request_hash) DO UPDATE SET
    fingerprint = excluded.fingerprint, tool = excluded.tool, bot_id = excluded.bot_id, result = excluded.result,
    created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE team_request.expires_at <= excluded.created_at

-- name: team_request_prune
-- Drop entries past their 30 days (the reaper's sweep).
DELETE FROM team_request WHERE expires_at <= :now
