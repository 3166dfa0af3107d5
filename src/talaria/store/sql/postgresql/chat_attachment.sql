-- name: chat_attachment_insert
-- An uploaded attachment, in no message yet (chat.md 3.4).
INSERT INTO chat_attachment (id, conversation_id, name, media_type, kind, bytes, sha256, state, data, created_at,
                             updated_at)
VALUES (:id, :conversation_id, :name, :media_type, :kind, :bytes, :sha256, 'uploaded', :data, :now, :now)

-- name: chat_attachment_get
-- One attachment of a conversation (without its bytes).
SELECT id, conversation_id, name, media_type, kind, bytes, sha256, state, message_id, runner_id, node_path,
       created_at, updated_at
FROM chat_attachment WHERE conversation_id = :conversation_id AND id = :id

-- name: chat_attachment_data
-- An attachment's bytes, until they are sent.
SELECT data FROM chat_attachment WHERE id = :id

-- name: chat_attachment_unsent_count
-- How many attachments of a conversation are uploaded or attached and not yet sent.
SELECT COUNT(*) AS n FROM chat_attachment
WHERE conversation_id = :conversation_id AND state IN ('uploaded', 'attached')

-- name: chat_attachment_attach
-- An uploaded attachment put in an accepted user message.
UPDATE chat_attachment SET state = 'attached', message_id = :message_id, updated_at = :now
WHERE id = :id AND state = 'uploaded'

-- name: chat_attachment_sent
-- An attachment's RPC went to the runner: its bytes are dropped, where it went is kept.
UPDATE chat_attachment SET state = 'sent', data = NULL, runner_id = :runner_id, node_path = :node_path,
                           updated_at = :now
WHERE id = :id

-- name: chat_attachment_delete
-- Remove an attachment still in no message.
DELETE FROM chat_attachment WHERE id = :id AND state = 'uploaded'

-- name: chat_attachment_expire
-- Uploads unused since a time expire: their bytes are dropped.
UPDATE chat_attachment SET state = 'expired', data = NULL, updated_at = :now
WHERE state = 'uploaded' AND created_at < :before

-- name: chat_attachment_expire_of
-- One conversation's uploads unused since a time expire (what an upload, a removal or a send of that conversation
-- sees at once; the reaper's sweep takes the rest).
UPDATE chat_attachment SET state = 'expired', data = NULL, updated_at = :now
WHERE conversation_id = :conversation_id AND state = 'uploaded' AND created_at < :before

-- name: chat_attachment_of_messages
-- The attachments of messages (chat.md 3.1), in upload order.
SELECT id, conversation_id, name, media_type, kind, bytes, sha256, state, message_id, runner_id, node_path,
       created_at, updated_at
FROM chat_attachment WHERE conversation_id = :conversation_id AND message_id IS NOT NULL
ORDER BY created_at, id
