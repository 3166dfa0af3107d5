-- name: tenant_ensure
-- Create a tenant if it does not exist yet.
INSERT INTO tenant (name, created_at) VALUES (:name, :now) ON CONFLICT (name) DO NOTHING

-- name: tenant_get
-- One tenant by name.
SELECT name, created_at FROM tenant WHERE name = :name

-- name: tenant_lock
-- Hold a tenant's row for the rest of the transaction (scale.md 3.7): account changes of one tenant take turns, so
-- two admins demoted at once cannot both see the other still enabled (the last admin stays, web-api.md 3).
SELECT name FROM tenant WHERE name = :name
