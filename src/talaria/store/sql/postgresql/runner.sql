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
UPDATE runner SET enabled = 0, disabled_at = :now WHERE id = :id AND enabled = 1

-- name: runner_drain_request
-- `talaria admin runners drain` on a hub it cannot reach (operations.md 3.1): applied at the runner's next request.
UPDATE runner SET drain_requested_at = :now WHERE id = :id AND tenant = :tenant AND enabled = 1

-- name: runner_drain_request_clear
-- The hub applied the request, or dropped it (the state is newer); a newer request stays.
UPDATE runner SET drain_requested_at = NULL WHERE id = :id AND drain_requested_at = :requested_at
