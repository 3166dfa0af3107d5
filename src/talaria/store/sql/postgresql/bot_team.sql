-- name: bot_team_get
-- A bot's team permission and provenance row (team-tools.md 3.1); none: false and null.
SELECT * FROM bot_team WHERE bot_id = :bot_id

-- name: bot_team_set_permission
-- Set a bot's team permission: teamRevision +1 on a change; a grant records who and when.
INSERT INTO bot_team (bot_id, tenant, owner, team_permission, team_revision, team_granted_by, team_granted_at,
                      updated_at)
VALUES (:bot_id, :tenant, :owner, :permission::int, 1, :granted_by, :granted_at, :now)
ON CONFLICT (bot_id) DO UPDATE SET
    team_permission = excluded.team_permission,
    team_revision = bot_team.team_revision + 1,
    team_granted_by = COALESCE(excluded.team_granted_by, bot_team.team_granted_by),
    team_granted_at = COALESCE(excluded.team_granted_at, bot_team.team_granted_at),
    updated_at = excluded.updated_at
WHERE bot_team.team_permission <> excluded.team_permission

-- name: bot_team_live_team_of
-- One non-archived team the bot is a member of, if any (archiving it is then 409 bot_in_use).
SELECT tm.team_id FROM team_member tm JOIN team t ON t.id = tm.team_id
WHERE tm.bot_id = :bot_id AND t.archived = 0
LIMIT 1

-- name: bot_team_made_by_tool
-- A bot a team tool made (team-tools.md 3.1): no permission, its creator and the turn.
INSERT INTO bot_team (bot_id, tenant, owner, team_permission, team_revision, created_by_bot_id, created_in_turn_id,
                      updated_at)
VALUES (:bot_id, :tenant, :owner, 0, 0, :created_by_bot_id, :created_in_turn_id, :now)
