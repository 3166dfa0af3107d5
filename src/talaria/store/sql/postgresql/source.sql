-- name: source_ensure
-- Create a source on its first registration.
INSERT INTO source (tenant, name, created_at) VALUES (:tenant, :name, :now) ON CONFLICT (tenant, name) DO NOTHING

-- name: source_list
-- Sources of a tenant by name.
SELECT * FROM source WHERE tenant = :tenant ORDER BY name
