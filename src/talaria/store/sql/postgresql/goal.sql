-- name: goal_insert
-- A new goal, running (team-tools.md 3.3 G1); its authority and origin captured.
INSERT INTO goal (id, tenant, owner, team_id, coordinator_id, title, title_key, objective, status,
                  acceptance_criteria, origin_conversation_id, origin_turn_id, team_revision, auth_version,
                  last_turn_id, created_at, updated_at)
VALUES (:id, :tenant, :owner, :team_id, :coordinator_id, :title, :title_key, :objective, 'running',
        :acceptance_criteria, :origin_conversation_id, :origin_turn_id, :team_revision, :auth_version,
        :origin_turn_id, :now, :now)

-- name: goal_get
-- One goal of an owner (another owner's goal is not found).
SELECT * FROM goal WHERE tenant = :tenant AND owner = :owner AND id = :id

-- name: goal_open_count
-- How many non-terminal goals a team has.
SELECT COUNT(*) AS n FROM goal WHERE team_id = :team_id AND status NOT IN ('complete', 'blocked', 'cancelled')

-- name: goal_title_taken
-- Another non-terminal goal of the team with this casefolded title.
SELECT 1 AS taken FROM goal WHERE team_id = :team_id AND title_key = :title_key
  AND status NOT IN ('complete', 'blocked', 'cancelled') AND id <> :id

-- name: goal_newest_of_team
-- A team's newest goals.
SELECT * FROM goal WHERE team_id = :team_id ORDER BY created_at DESC, id DESC LIMIT :limit

-- name: goal_set
-- Write a goal's changing fields, if it is still at the revision read (revision +1).
UPDATE goal SET status = :status, cause = :cause, acceptance_criteria = :acceptance_criteria,
                acceptance_revision = :acceptance_revision, checks = :checks, result = :result,
                activation = :activation, automatic_wakes = :automatic_wakes,
                origin_conversation_id = :origin_conversation_id, origin_turn_id = :origin_turn_id,
                team_revision = :team_revision, auth_version = :auth_version, last_turn_id = :last_turn_id,
                finish_turn_id = :finish_turn_id, wake_turn_id = :wake_turn_id, last_signature = :last_signature,
                stopped_by = :stopped_by, finished_at = :finished_at, revision = revision + 1, updated_at = :now
WHERE id = :id AND revision = :expected_revision

-- name: goal_by_id
-- One goal by id (the reconciler's read; routes use goal_get, keyed by owner).
SELECT * FROM goal WHERE id = :id

-- name: goal_open_all
-- Every goal not terminal, oldest first (the reconciler's pass).
SELECT * FROM goal WHERE status NOT IN ('complete', 'blocked', 'cancelled') ORDER BY created_at, id

-- name: goal_get_tenant
-- One goal of a tenant, any owner (an admin's read).
SELECT * FROM goal WHERE tenant = :tenant AND id = :id

-- name: goal_page
-- A tenant's goals (of one owner, team or status, when given), newest first (ties by id), after a cursor.
SELECT * FROM goal
WHERE tenant = :tenant AND (:owner IS NULL OR owner = :owner) AND (:team_id IS NULL OR team_id = :team_id)
  AND (:status IS NULL OR status = :status)
  AND (:cursor_at IS NULL OR created_at < :cursor_at OR (created_at = :cursor_at AND id < :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit
