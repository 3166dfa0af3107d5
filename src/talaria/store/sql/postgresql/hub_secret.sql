-- name: hub_secret_make
-- The first replica's key wins (scale.md 1): a key of that name already made is kept.
INSERT INTO hub_secret (name, value, created_at) VALUES (:name, :value, :now) ON CONFLICT (name) DO NOTHING

-- name: hub_secret_get
-- One of the hub's keys.
SELECT value FROM hub_secret WHERE name = :name
