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

-- name: schema_tables
-- The user tables, triggers and indexes of the database, for the schema comparison test.
SELECT type, name, tbl_name, sql FROM sqlite_master
WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name
