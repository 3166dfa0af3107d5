-- name: team_member_of
-- A team's members, the administrator first.
SELECT bot_id FROM team_member WHERE team_id = :team_id ORDER BY position

-- name: team_member_insert
-- One member of a team at its position (0: the administrator).
INSERT INTO team_member (team_id, bot_id, position) VALUES (:team_id, :bot_id, :position)

-- name: team_member_clear
-- Drop a team's members (before writing its new list).
DELETE FROM team_member WHERE team_id = :team_id
