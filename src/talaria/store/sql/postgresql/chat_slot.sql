-- name: chat_slot_take
-- Take slot :slot of a runner for a chat turn about to be sent (scale.md 3.7): when it is missing, held by this
-- turn already, or its turn has ended. No row back: the slot is busy.
INSERT INTO chat_slot AS s (runner_id, slot, turn_id, taken_at) VALUES (:runner_id, :slot, :turn_id, :now)
ON CONFLICT (runner_id, slot) DO UPDATE SET turn_id = :turn_id, taken_at = :now
WHERE s.turn_id = :turn_id
   OR NOT EXISTS (SELECT 1 FROM chat_turn t WHERE t.id = s.turn_id
                  AND t.state IN ('queued', 'pending', 'running', 'recovering'))
RETURNING slot

-- name: chat_slot_free
-- The turn's attempt on the runner is over: its slot is free at once.
DELETE FROM chat_slot WHERE runner_id = :runner_id AND slot = :slot AND turn_id = :turn_id

-- name: chat_slot_drop_turn
-- Before a turn takes a slot: whatever slot it held before (an earlier attempt's, a dead replica's) is given up.
DELETE FROM chat_slot WHERE runner_id = :runner_id AND turn_id = :turn_id
