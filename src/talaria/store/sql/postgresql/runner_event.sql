-- name: runner_event_insert
-- An accepted frame (or the runner's close marker, no frame) at its seq, checked by the caller under the gateway lock.
INSERT INTO runner_event (connection_id, seq, frame, closed) VALUES (:connection_id, :seq, :frame, :closed)

-- name: runner_event_after
-- A gateway's frames after its owner's cursor, in order, with whether its account lost its access and its owner
-- counter (another replica adopted it when that moved on).
SELECT e.seq, e.frame, e.closed, g.revoked, g.owner_counter
FROM runner_event e JOIN runner_gateway g ON g.id = e.connection_id
WHERE e.connection_id = :connection_id AND e.seq > :after
ORDER BY e.seq LIMIT 500
