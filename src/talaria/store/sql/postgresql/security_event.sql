-- name: security_event_insert
-- Record a rejected Runtime API request (rate-limited by the caller).
INSERT INTO security_event (id, occurred_at, peer, method, route, status, code, claimed_principal,
                            claimed_tenant, job, detail, suppressed_count)
VALUES (:id, :now, :peer, :method, :route, :status, :code, :claimed_principal, :claimed_tenant, :job,
        :detail, :suppressed_count)

-- name: security_event_recent
-- The latest security events, newest first.
SELECT * FROM security_event ORDER BY occurred_at DESC, id DESC LIMIT :limit
