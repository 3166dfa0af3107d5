-- name: chat_conversation_insert
-- Start a conversation with a bot (chat.md 3.2).
INSERT INTO chat_conversation (id, tenant, owner, bot_id, title, title_set, created_at, updated_at, last_activity_at)
VALUES (:id, :tenant, :owner, :bot_id, :title, :title_set::int, :now, :now, :now)

-- name: chat_conversation_get
-- One conversation of an owner, with its bot's name, source, profile and archived flag.
SELECT c.*, b.name AS bot_name, b.source AS bot_source, b.profile AS bot_profile, b.archived AS bot_archived,
       (SELECT COUNT(*) FROM chat_message m WHERE m.conversation_id = c.id) AS message_count,
       (SELECT t.id FROM chat_turn t WHERE t.conversation_id = c.id
          AND t.state IN ('pending', 'running', 'recovering')) AS live_turn_id
FROM chat_conversation c JOIN bot b ON b.id = c.bot_id
WHERE c.tenant = :tenant AND c.owner = :owner AND c.id = :id

-- name: chat_conversation_list
-- An owner's conversations, archived or not, by last activity, newest first (ties by id), after a cursor.
SELECT c.*, b.name AS bot_name, b.source AS bot_source, b.profile AS bot_profile, b.archived AS bot_archived,
       (SELECT COUNT(*) FROM chat_message m WHERE m.conversation_id = c.id) AS message_count,
       (SELECT t.id FROM chat_turn t WHERE t.conversation_id = c.id
          AND t.state IN ('pending', 'running', 'recovering')) AS live_turn_id
FROM chat_conversation c JOIN bot b ON b.id = c.bot_id
WHERE c.tenant = :tenant AND c.owner = :owner AND c.archived = :archived::int
  AND (:cursor_at IS NULL OR c.last_activity_at < :cursor_at
       OR (c.last_activity_at = :cursor_at AND c.id < :cursor_id))
ORDER BY c.last_activity_at DESC, c.id DESC
LIMIT :limit

-- name: chat_conversation_live_count
-- How many conversations an owner has that are not archived.
SELECT COUNT(*) AS n FROM chat_conversation WHERE tenant = :tenant AND owner = :owner AND archived = 0

-- name: chat_conversation_update
-- Change a conversation's title or archived flag.
UPDATE chat_conversation SET title = :title, title_set = :title_set::int, archived = :archived::int, updated_at = :now
WHERE id = :id

-- name: chat_conversation_owner
-- Who owns a conversation of the tenant (for the audit log's visibility), if it exists.
SELECT owner FROM chat_conversation WHERE tenant = :tenant AND id = :id

-- name: chat_conversation_titled
-- The first accepted user turn titles a conversation its owner has not titled (chat.md 3.2).
UPDATE chat_conversation SET title = :title, updated_at = :now WHERE id = :id AND title_set = 0

-- name: chat_conversation_touch
-- A conversation had activity (a message stored).
UPDATE chat_conversation SET last_activity_at = :now, updated_at = :now WHERE id = :id

-- name: chat_conversation_bind
-- The conversation's runner and Hermes stored session, and whether that session may be resumed (chat.md 2).
UPDATE chat_conversation SET runner_id = :runner_id, hermes_session_id = :hermes_session_id,
                             session_reusable = :session_reusable::int, updated_at = :now
WHERE id = :id

-- name: chat_conversation_by_id
-- One conversation with its bot, for the turn engine.
SELECT c.*, b.name AS bot_name, b.source AS bot_source, b.profile AS bot_profile, b.archived AS bot_archived,
       b.instructions AS bot_instructions,
       (SELECT COUNT(*) FROM chat_message m WHERE m.conversation_id = c.id) AS message_count,
       (SELECT t.id FROM chat_turn t WHERE t.conversation_id = c.id
          AND t.state IN ('pending', 'running', 'recovering')) AS live_turn_id
FROM chat_conversation c JOIN bot b ON b.id = c.bot_id
WHERE c.id = :id

-- name: chat_conversation_reserve_events
-- Reserve the next block of live-stream event ids (chat.md 4.2); returns the new high-water.
UPDATE chat_conversation SET event_seq_reserved = event_seq_reserved + :block WHERE id = :id
RETURNING event_seq_reserved

-- name: chat_conversation_event_seq
-- A conversation's reserved high-water of live-stream event ids (0 before any).
SELECT event_seq_reserved FROM chat_conversation WHERE id = :id

-- name: chat_conversation_session_moved
-- The end-of-turn session.info named another stored session (Hermes compressed it): the binding follows, if the
-- conversation is still bound to the session the turn ended in.
UPDATE chat_conversation SET hermes_session_id = :hermes_session_id, updated_at = :now
WHERE id = :id AND runner_id = :runner_id AND hermes_session_id = :was

-- name: chat_conversation_lock
-- Hold a conversation's row for the rest of the transaction: its queue of turns is read and changed by one writer.
SELECT id FROM chat_conversation WHERE id = :id FOR UPDATE

-- name: chat_conversation_unreuse_all
-- A restore: no conversation resumes its Hermes session (the next turn opens one with the carry-over, chat.md 5.3).
UPDATE chat_conversation SET session_reusable = 0 WHERE session_reusable = 1
