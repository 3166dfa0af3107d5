-- name: team_delivery_insert
-- A report-back delivery, pending (team-tools.md 7); the same goal, activation, kind and signature is one delivery.
INSERT INTO team_delivery (id, goal_id, activation, kind, signature, status, goal_status, created_at, updated_at)
VALUES (:id, :goal_id, :activation, :kind, :signature, 'pending', :goal_status, :now, :now)
ON CONFLICT (goal_id, activation, kind, signature) DO NOTHING

-- name: team_delivery_of_goal
-- A goal's deliveries, oldest first.
SELECT * FROM team_delivery WHERE goal_id = :goal_id ORDER BY created_at, id
