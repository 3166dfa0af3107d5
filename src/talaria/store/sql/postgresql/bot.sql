-- name: bot_insert
-- Create a bot (chat.md 2).
INSERT INTO bot (id, tenant, owner, name, name_key, source, profile, instructions, archived, revision, created_at,
                 updated_at)
VALUES (:id, :tenant, :owner, :name, :name_key, :source, :profile, :instructions, 0, 1, :now, :now)

-- name: bot_get
-- One bot of an owner (another owner's bot is not found).
SELECT * FROM bot WHERE tenant = :tenant AND owner = :owner AND id = :id

-- name: bot_list
-- An owner's bots, archived or not, newest first (ties by id), after a cursor.
SELECT * FROM bot
WHERE tenant = :tenant AND owner = :owner AND archived = :archived::int
  AND (:cursor_at IS NULL OR created_at < :cursor_at OR (created_at = :cursor_at AND id < :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: bot_live_count
-- How many bots an owner has that are not archived.
SELECT COUNT(*) AS n FROM bot WHERE tenant = :tenant AND owner = :owner AND archived = 0

-- name: bot_name_taken
-- Whether another of the owner's non-archived bots has this casefolded name.
SELECT 1 AS taken FROM bot
WHERE tenant = :tenant AND owner = :owner AND name_key = :name_key AND archived = 0 AND id <> :id

-- name: bot_update
-- Change a bot's name, instructions or archived flag, if it is still at the revision read.
UPDATE bot SET name = :name, name_key = :name_key, instructions = :instructions, archived = :archived::int,
               revision = revision + 1, updated_at = :now
WHERE id = :id AND revision = :expected_revision

-- name: bot_owner
-- Who owns a bot of the tenant (for the audit log's visibility), if it exists.
SELECT owner FROM bot WHERE tenant = :tenant AND id = :id

-- name: bot_bump_revision
-- A change kept beside the bot (its team permission, team-tools.md 3.1) is a change of the bot: revision +1.
UPDATE bot SET revision = revision + 1, updated_at = :now WHERE id = :id AND revision = :expected_revision

-- name: bot_live_by_name
-- An owner's non-archived bots by name (team tools' list, team-tools.md 6.3).
SELECT * FROM bot WHERE tenant = :tenant AND owner = :owner AND archived = 0 ORDER BY name_key, id
