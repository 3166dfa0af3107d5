-- name: stream_event_insert
-- One event of a conversation's stream (scale.md 4.2), in the transaction of the change it announces.
INSERT INTO stream_event (stream, id, type, data) VALUES (:stream, :id, :type, :data)

-- name: stream_event_trim
-- A stream keeps its latest events only (chat.md 4.2: 2,000).
DELETE FROM stream_event WHERE stream = :stream AND id <= :below

-- name: stream_event_after
-- The stream's retained events above a resume point or a follower's cursor, in id order.
SELECT id, type, data FROM stream_event WHERE stream = :stream AND id > :after ORDER BY id LIMIT :limit

-- name: stream_event_oldest
-- The oldest id the stream retains (NULL: none).
SELECT min(id) AS id FROM stream_event WHERE stream = :stream

-- name: stream_event_prune
-- Streams idle since :before keep no events (chat.md 4.2: 15 minutes after the last); their counters stay.
DELETE FROM stream_event e USING stream_counter c WHERE e.stream = c.stream AND c.last_at <= :before
