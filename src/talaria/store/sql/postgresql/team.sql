-- name: team_insert
-- A new team (team-tools.md 3.2); its members are team_member rows written with it.
INSERT INTO team (id, tenant, owner, name, name_key, administrator_id, instructions, archived, revision,
                  created_in_turn_id, created_at, updated_at)
VALUES (:id, :tenant, :owner, :name, :name_key, :administrator_id, :instructions, 0, 1, :created_in_turn_id, :now,
        :now)

-- name: team_get
-- One team of an owner (another owner's team is not found).
SELECT * FROM team WHERE tenant = :tenant AND owner = :owner AND id = :id

-- name: team_name_taken
-- Another of the administrator's non-archived teams with this casefolded name.
SELECT 1 AS taken FROM team WHERE administrator_id = :administrator_id AND name_key = :name_key AND archived = 0
  AND id <> :id

-- name: team_live_count
-- How many non-archived teams a bot administers.
SELECT COUNT(*) AS n FROM team WHERE administrator_id = :administrator_id AND archived = 0

-- name: team_administered
-- The non-archived teams a bot administers, oldest first.
SELECT * FROM team WHERE tenant = :tenant AND owner = :owner AND administrator_id = :administrator_id
  AND archived = 0
ORDER BY created_at, id

-- name: team_update
-- Rename, re-instruct or archive a team, if it is still at the revision read.
UPDATE team SET name = :name, name_key = :name_key, instructions = :instructions, archived = :archived::int,
                revision = revision + 1, updated_at = :now
WHERE id = :id AND revision = :expected_revision

-- name: team_get_tenant
-- One team of a tenant, any owner (an admin's read).
SELECT * FROM team WHERE tenant = :tenant AND id = :id

-- name: team_page
-- A tenant's teams (of one owner, when given), newest first (ties by id), after a cursor.
SELECT * FROM team
WHERE tenant = :tenant AND (:owner IS NULL OR owner = :owner)
  AND (:cursor_at IS NULL OR created_at < :cursor_at OR (created_at = :cursor_at AND id < :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit
