-- name: idempotency_get
-- A stored idempotency key in its scope, if still retained.
SELECT * FROM idempotency_key
WHERE principal = :principal AND operation = :operation AND job_id = :job_id AND key_hash = :key_hash
  AND expires_at > :now

-- name: idempotency_put
-- Store the response of an applied request under its key (replacing an expired row of the same key).
INSERT INTO idempotency_key (principal, operation, job_id, key_hash, request_digest, response_status,
                             response_body, revision_after, created_at, expires_at)
VALUES (:principal, :operation, :job_id, :key_hash, :request_digest, :response_status, :response_body,
        :revision_after, :now, :expires_at)
ON CONFLICT (principal, operation, job_id, key_hash) DO UPDATE SET
    request_digest = excluded.request_digest, response_status = excluded.response_status,
    response_body = excluded.response_body, revision_after = excluded.revision_after,
    created_at = excluded.created_at, expires_at = excluded.expires_at

-- name: idempotency_prune
-- Delete keys past their retention.
DELETE FROM idempotency_key WHERE expires_at <= :now
