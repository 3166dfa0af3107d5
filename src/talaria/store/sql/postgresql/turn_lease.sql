-- name: turn_lease_take
-- Take a chat turn's lease (scale.md 4.3) when it is free, expired, or held by a replica no longer live (renewed
-- at or before :since); the counter grows on each take. No row back: another live replica drives the turn.
INSERT INTO turn_lease AS l (turn_id, holder, counter, expires_at) VALUES (:turn_id, :holder, 1, :expires_at)
ON CONFLICT (turn_id) DO UPDATE SET holder = :holder, counter = l.counter + 1, expires_at = :expires_at
WHERE l.holder IS NULL OR l.expires_at <= :now
   OR NOT EXISTS (SELECT 1 FROM hub_replica r WHERE r.id = l.holder AND r.renewed_at > :since)
RETURNING counter

-- name: turn_lease_fence
-- The owner's writes are fenced by its lease (scale.md 4.3): the row locked while the owner's transaction runs, so a
-- take by another replica waits for it, and is seen by it once committed. No row back: the lease moved on.
SELECT counter FROM turn_lease WHERE turn_id = :turn_id AND holder = :holder AND counter = :counter FOR UPDATE

-- name: turn_lease_renew
-- Renew every lease this replica holds of the turns it still drives; the rows back are those it still holds.
UPDATE turn_lease SET expires_at = :expires_at WHERE holder = :holder AND turn_id = ANY(:turn_ids)
RETURNING turn_id, counter

-- name: turn_lease_release
-- The owner lets an unended turn go: at once free for another replica, its counter kept (fencing stays monotonic).
UPDATE turn_lease SET holder = NULL, expires_at = 0 WHERE turn_id = :turn_id AND holder = :holder AND counter = :counter

-- name: turn_lease_drop
-- The owner is done with a turn that has ended: its row goes (0 rows while the turn is unended: release it instead).
DELETE FROM turn_lease l WHERE l.turn_id = :turn_id AND l.holder = :holder AND l.counter = :counter
AND NOT EXISTS (SELECT 1 FROM chat_turn t WHERE t.id = l.turn_id AND t.state IN ('queued', 'pending', 'running',
                                                                                  'recovering'))

-- name: turn_lease_elsewhere
-- The turns another live replica drives now: the scan leaves them alone.
SELECT l.turn_id FROM turn_lease l JOIN hub_replica r ON r.id = l.holder AND r.renewed_at > :since
WHERE l.holder <> :holder AND l.expires_at > :now

-- name: turn_lease_release_all
-- A stopping replica lets go of every turn it drives, so the others recover them without waiting for expiry.
UPDATE turn_lease SET holder = NULL, expires_at = 0 WHERE holder = :holder

-- name: turn_lease_get
-- A turn's lease as it is (tests and db status).
SELECT turn_id, holder, counter, expires_at FROM turn_lease WHERE turn_id = :turn_id
