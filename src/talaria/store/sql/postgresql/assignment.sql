-- name: assignment_insert
-- A new assignment, pending (team-tools.md 3.4 A1).
INSERT INTO assignment (id, tenant, owner, goal_id, bot_id, title, brief, acceptance_criteria, depends_on, status,
                        attempt, max_attempts, created_at, updated_at)
VALUES (:id, :tenant, :owner, :goal_id, :bot_id, :title, :brief, :acceptance_criteria, :depends_on, 'pending', 0,
        :max_attempts, :now, :now)

-- name: assignment_get
-- One assignment of an owner.
SELECT * FROM assignment WHERE tenant = :tenant AND owner = :owner AND id = :id

-- name: assignment_of_goal
-- A goal's assignments, oldest first.
SELECT * FROM assignment WHERE goal_id = :goal_id ORDER BY created_at, id

-- name: assignment_count_of_goal
-- How many assignments a goal has, every status and activation.
SELECT COUNT(*) AS n FROM assignment WHERE goal_id = :goal_id

-- name: assignment_open_of_bot
-- One open assignment of a bot in a non-terminal goal (of one team, or of any: team_id null), if any.
SELECT a.id FROM assignment a JOIN goal g ON g.id = a.goal_id
WHERE a.bot_id = :bot_id AND a.status NOT IN ('complete', 'cancelled')
  AND g.status NOT IN ('complete', 'blocked', 'cancelled') AND (:team_id IS NULL OR g.team_id = :team_id)
LIMIT 1

-- name: assignment_set
-- Write an assignment's changing fields, if it is still at the revision read (revision +1).
UPDATE assignment SET status = :status, attempt = :attempt, max_attempts = :max_attempts, result = :result,
                      review = :review, task_id = :task_id, job_id = :job_id, revision = revision + 1,
                      updated_at = :now
WHERE id = :id AND revision = :expected_revision

-- name: assignment_running_count_owner
-- How many assignments of an owner are running (goal turns, team-tools.md 4.2).
SELECT COUNT(*) AS n FROM assignment WHERE tenant = :tenant AND owner = :owner AND status = 'running'
