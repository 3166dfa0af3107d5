-- name: chat_message_insert
-- Store a message at the conversation's next ordinal (chat.md 2: the transcript).
INSERT INTO chat_message (id, conversation_id, turn_id, ordinal, role, author, content, reference, status, final,
                          recovered, tool_id, tool_name, tool_context, tool_summary, duration_ms, usage, created_at)
VALUES (:id, :conversation_id, :turn_id,
        (SELECT COALESCE(MAX(ordinal), 0) + 1 FROM chat_message WHERE conversation_id = :conversation_id),
        :role, :author, :content, :reference, :status, :final::int, :recovered::int, :tool_id, :tool_name,
        :tool_context, :tool_summary, :duration_ms, :usage, :now)

-- name: chat_message_get
-- One message of a conversation.
SELECT * FROM chat_message WHERE conversation_id = :conversation_id AND id = :id

-- name: chat_message_page
-- A conversation's messages, newest first by ordinal, before a cursor.
SELECT * FROM chat_message
WHERE conversation_id = :conversation_id AND (:before IS NULL OR ordinal < :before)
ORDER BY ordinal DESC
LIMIT :limit

-- name: chat_message_count
-- How many messages a conversation has stored, any role.
SELECT COUNT(*) AS n FROM chat_message WHERE conversation_id = :conversation_id

-- name: chat_message_user_count
-- How many user messages a conversation has (the first one titles an untitled conversation).
SELECT COUNT(*) AS n FROM chat_message WHERE conversation_id = :conversation_id AND role = 'user'

-- name: chat_message_finish_tool
-- A tool message done: its summary and duration.
UPDATE chat_message SET status = 'done', tool_summary = :summary, duration_ms = :duration_ms
WHERE conversation_id = :conversation_id AND turn_id = :turn_id AND tool_id = :tool_id AND status = 'running'

-- name: chat_message_transcript
-- A conversation's user messages and complete final replies, newest first (the carry-over, chat.md 5.4).
SELECT * FROM chat_message
WHERE conversation_id = :conversation_id
  AND (role = 'user' OR (role = 'assistant' AND final = 1 AND status = 'complete'))
ORDER BY ordinal DESC
LIMIT :limit

-- name: chat_message_reply_of_turn
-- Whether a turn stored a non-empty assistant reply (team-tools.md 7: the wake after a finish is then skipped).
SELECT 1 AS replied FROM chat_message
WHERE turn_id = :turn_id AND role = 'assistant' AND TRIM(content) <> ''
LIMIT 1

-- name: chat_message_tools_of_turn
-- A turn's tool messages by Hermes' tool id (a replica taking the turn over completes them, scale.md 4.4).
SELECT id, tool_id FROM chat_message WHERE turn_id = :turn_id AND tool_id IS NOT NULL
