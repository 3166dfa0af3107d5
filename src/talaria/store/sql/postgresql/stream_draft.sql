-- name: stream_draft_append
-- A delta of the live turn's draft (chat.md 4.3), in the delta's transaction: a snapshot read on any replica shows
-- exactly the draft text of the events up to its lastEventId. Another message id starts the text again.
INSERT INTO stream_draft AS d (stream, turn_id, message_id, content) VALUES (:stream, :turn_id, :message_id, :text)
ON CONFLICT (stream) DO UPDATE SET turn_id = :turn_id, message_id = :message_id,
    content = CASE WHEN d.message_id = :message_id THEN d.content || :text ELSE :text END

-- name: stream_draft_stored
-- The draft's message was stored (its message event staged in this transaction): no longer a draft.
DELETE FROM stream_draft WHERE stream = :stream AND message_id = :message_id

-- name: stream_draft_get
-- The conversation's draft as of the snapshot reading it.
SELECT turn_id, message_id, content FROM stream_draft WHERE stream = :stream
