-- name: tenant_ensure
-- Create a tenant if it does not exist yet.
INSERT INTO tenant (name, created_at) VALUES (:name, :now) ON CONFLICT (name) DO NOTHING

-- name: tenant_get
-- One tenant by name.
SELECT name, created_at FROM tenant WHERE name = :name
