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
UPDATE team SET name = :name, name_key = :name_key, instructions = :instructions, archived = :archived,
                revision = revision + 1, updated_at = :now
WHERE id = :id AND revision = :expected_revision
