-- name: team_delivery_insert
-- A report-back delivery, pending (team-tools.md 7); the same goal, activation, kind and signature is one delivery.
INSERT INTO team_delivery (id, goal_id, activation, kind, signature, status, goal_status, created_at, updated_at)
VALUES (:id, :goal_id, :activation, :kind, :signature, 'pending', :goal_status, :now, :now)
ON CONFLICT (goal_id, activation, kind, signature) DO NOTHING

-- name: team_delivery_of_goal
-- A goal's deliveries, oldest first.
SELECT * FROM team_delivery WHERE goal_id = :goal_id ORDER BY created_at, id

-- name: team_delivery_pending
-- Deliveries not yet handled, oldest first.
SELECT * FROM team_delivery WHERE status = 'pending' ORDER BY created_at, id

-- name: team_delivery_finish
-- A pending delivery delivered or suppressed, once.
UPDATE team_delivery SET status = :status, reason = :reason, message_id = :message_id, wake_turn_id = :wake_turn_id,
                         woke = :woke::int, updated_at = :now
WHERE id = :id AND status = 'pending'

-- name: team_delivery_get
-- One delivery by id.
SELECT * FROM team_delivery WHERE id = :id
