-- name: stream_counter_next
-- The stream's next event id (scale.md 4.2), in the transaction writing the event: the row stays locked until that
-- commits, so ids strictly increase per conversation and none commits before a lower one. A stream without a row
-- starts above its conversation's event_seq_reserved (ids copied from SQLite keep increasing). No row back: no such
-- conversation.
INSERT INTO stream_counter AS c (stream, last_id, last_at)
SELECT id, event_seq_reserved + 1, :now FROM chat_conversation WHERE id = :stream
ON CONFLICT (stream) DO UPDATE SET last_id = c.last_id + 1, last_at = :now
RETURNING last_id

-- name: stream_counter_get
-- The newest id issued for the stream and when (no row: none issued on PostgreSQL yet).
SELECT last_id, last_at FROM stream_counter WHERE stream = :stream

-- name: stream_counter_of
-- The newest ids of the streams followed on this replica: the one bounded fallback read of scale.md 3.3.
SELECT stream, last_id FROM stream_counter WHERE stream = ANY(:streams)
