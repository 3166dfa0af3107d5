-- name: runner_insert
-- Register a runner (enabled) for a source; no row when the source has an enabled one (a concurrent one too).
INSERT INTO runner (id, tenant, name, source, allowed_profiles, token_hash, enabled, server_url, hermes_url,
                    artifact_roots, allow_insecure_lan, created_at)
VALUES (:id, :tenant, :name, :source, :allowed_profiles, :token_hash, 1, :server_url, :hermes_url,
        :artifact_roots, :allow_insecure_lan::int, :now)
ON CONFLICT (tenant, source) WHERE enabled = 1 DO NOTHING
RETURNING id

-- name: runner_get
-- One runner by id (any tenant: the machine API knows only the id).
SELECT * FROM runner WHERE id = :id

-- name: runner_list
-- Every runner of a tenant, disabled ones included, oldest first.
SELECT * FROM runner WHERE tenant = :tenant ORDER BY created_at, id

-- name: runner_enabled_for_source
-- The enabled runner of a source, if any.
SELECT * FROM runner WHERE tenant = :tenant AND source = :source AND enabled = 1

-- name: runner_disable
-- Disable a runner for good (there is no re-enable).
UPDATE runner SET enabled = 0, disabled_at = :now, token_next_hash = NULL, token_next_issued_at = NULL,
       rotate_requested_at = NULL
WHERE id = :id AND enabled = 1

-- name: runner_drain_request
-- `talaria admin runners drain` on a hub it cannot reach (operations.md 3.1): applied at the runner's next request.
UPDATE runner SET drain_requested_at = :now WHERE id = :id AND tenant = :tenant AND enabled = 1

-- name: runner_drain_request_clear
-- The hub applied the request, or dropped it (the state is newer); a newer request stays.
UPDATE runner SET drain_requested_at = NULL WHERE id = :id AND drain_requested_at = :requested_at

-- name: runner_rotate_request
-- An admin asks the runner to rotate its token (operations.md 4.1); repeated, the first request's time stays.
UPDATE runner SET rotate_requested_at = COALESCE(rotate_requested_at, :now)
WHERE id = :id AND tenant = :tenant AND enabled = 1

-- name: runner_token_next_set
-- The rotate op: store the next token's hash, replacing an unused one; the row as it was before (the old next).
UPDATE runner SET token_next_hash = :next_hash, token_next_issued_at = :now,
       token_next_replaced_at = CASE WHEN token_next_hash IS NOT NULL AND token_next_issued_at > :expired_before
                                     THEN :now ELSE token_next_replaced_at END
WHERE id = :id AND enabled = 1
RETURNING token_next_replaced_at

-- name: runner_token_promote
-- The first request with the next token makes it the current one; no row when another request won.
UPDATE runner SET token_hash = token_next_hash, token_issued_at = :now, token_next_hash = NULL,
       token_next_issued_at = NULL, rotate_requested_at = NULL
WHERE id = :id AND enabled = 1 AND token_next_hash = :next_hash
RETURNING id
