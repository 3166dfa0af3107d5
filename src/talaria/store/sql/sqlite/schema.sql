-- name: schema_ping
-- A trivial query that proves the database answers.
SELECT 1 AS ok

-- name: schema_version_create
-- Create the migration bookkeeping table when it does not exist yet.
CREATE TABLE IF NOT EXISTS schema_version (
    migration_set TEXT PRIMARY KEY,
    version INTEGER NOT NULL
)

-- name: schema_version_list
-- Every migration set with its applied version.
SELECT migration_set, version FROM schema_version ORDER BY migration_set

-- name: schema_version_set
-- Record the applied version of one migration set.
INSERT INTO schema_version (migration_set, version) VALUES (:migration_set, :version)
ON CONFLICT (migration_set) DO UPDATE SET version = excluded.version

-- name: schema_step_create
-- Create the table of applied steps and whether each is additive (scale.md 2.5) when it does not exist yet.
CREATE TABLE IF NOT EXISTS schema_step (
    migration_set TEXT NOT NULL,
    version INTEGER NOT NULL,
    additive INTEGER NOT NULL CHECK (additive IN (0, 1)),
    PRIMARY KEY (migration_set, version)
)

-- name: schema_step_set
-- Record one applied step and whether it is additive.
INSERT INTO schema_step (migration_set, version, additive) VALUES (:migration_set, :version, :additive)
ON CONFLICT (migration_set, version) DO UPDATE SET additive = excluded.additive

-- name: schema_step_delete
-- Forget one reverted step.
DELETE FROM schema_step WHERE migration_set = :migration_set AND version = :version

-- name: schema_step_list
-- Every recorded step, by set and version.
SELECT migration_set, version, additive FROM schema_step ORDER BY migration_set, version

-- name: schema_tables
-- The user tables, triggers and indexes of the database, for the schema comparison test.
SELECT type, name, tbl_name, sql FROM sqlite_master
WHERE name NOT LIKE 'sqlite_%' AND tbl_name NOT IN ('schema_version', 'schema_step')
ORDER BY type, name
