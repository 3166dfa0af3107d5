-- name: chat_turn_insert
-- Accept or enqueue a turn (chat.md 3.3, 5.10).
INSERT INTO chat_turn (id, conversation_id, tenant, owner, state, trigger, trigger_message_id, auth_version, prompt,
                       idempotency_key_hash, request_digest, response_body, created_at, updated_at)
VALUES (:id, :conversation_id, :tenant, :owner, :state, :trigger, :trigger_message_id, :auth_version, :prompt,
        :idempotency_key_hash, :request_digest, :response_body, :now, :now)

-- name: chat_turn_get
-- One turn of an owner's conversation (another owner's is not found).
SELECT * FROM chat_turn WHERE tenant = :tenant AND owner = :owner AND conversation_id = :conversation_id AND id = :id

-- name: chat_turn_by_id
-- One turn, for the turn engine.
SELECT * FROM chat_turn WHERE id = :id

-- name: chat_turn_lock
-- One turn, held for the rest of the write transaction (its conversation's row first: lock order account,
-- conversation, turn), so that two writers of one turn take turns instead of one failing its revision check.
SELECT * FROM chat_turn WHERE id = :id

-- name: chat_turn_live
-- A conversation's live turn (pending, running or recovering), if any.
SELECT * FROM chat_turn
WHERE conversation_id = :conversation_id AND state IN ('pending', 'running', 'recovering')

-- name: chat_turn_by_key
-- The accepted turn of a conversation that stored this Idempotency-Key hash since a time, newest first.
SELECT * FROM chat_turn
WHERE conversation_id = :conversation_id AND idempotency_key_hash = :key_hash AND created_at >= :since
ORDER BY created_at DESC, id DESC
LIMIT 1

-- name: chat_turn_live_count_owner
-- How many live turns an owner has (chat.per_account).
SELECT COUNT(*) AS n FROM chat_turn
WHERE state IN ('pending', 'running', 'recovering') AND tenant = :tenant AND owner = :owner

-- name: chat_turn_live_count_all
-- How many live turns the hub has (chat.per_hub).
SELECT COUNT(*) AS n FROM chat_turn WHERE state IN ('pending', 'running', 'recovering')

-- name: chat_turn_unended
-- Every turn not yet ended, oldest first (the turn engine's scan and start-up recovery).
SELECT * FROM chat_turn
WHERE state IN ('queued', 'pending', 'running', 'recovering')
ORDER BY created_at, id

-- name: chat_turn_unended_owner
-- An owner's turns not yet ended (access revocation).
SELECT * FROM chat_turn
WHERE state IN ('queued', 'pending', 'running', 'recovering') AND tenant = :tenant AND owner = :owner
ORDER BY created_at, id

-- name: chat_turn_unended_conversation
-- A conversation's turns not yet ended (archiving).
SELECT * FROM chat_turn
WHERE state IN ('queued', 'pending', 'running', 'recovering') AND conversation_id = :conversation_id
ORDER BY created_at, id

-- name: chat_turn_set
-- Write a turn's changeable columns, if it is still at the revision read.
UPDATE chat_turn SET state = :state, code = :code, error = :error, waiting_reason = :waiting_reason,
                     reply_message_id = :reply_message_id, runner_id = :runner_id,
                     hermes_session_id = :hermes_session_id, carry = :carry, team_tools = :team_tools,
                     stop_requested = :stop_requested, marker = :marker, submit_state = :submit_state,
                     usage = :usage, submitted_at = :submitted_at, finished_at = :finished_at,
                     revision = revision + 1, updated_at = :now
WHERE id = :id AND revision = :expected_revision

-- name: chat_turn_keep_answer
-- Keep an accepted turn's Idempotency-Key hash, request digest and 202 answer (chat.md 3.3).
UPDATE chat_turn SET idempotency_key_hash = :key_hash, request_digest = :request_digest,
                     response_body = :response_body
WHERE id = :id

-- name: chat_turn_unended_bot
-- The turns not yet ended of every conversation with a bot (archiving the bot).
SELECT t.* FROM chat_turn t JOIN chat_conversation c ON c.id = t.conversation_id
WHERE t.state IN ('queued', 'pending', 'running', 'recovering') AND c.bot_id = :bot_id
ORDER BY t.created_at, t.id

-- name: chat_turn_last_usage
-- The usage the conversation's most recent ended turn stored (with the session totals it was computed from).
SELECT usage FROM chat_turn
WHERE conversation_id = :conversation_id AND usage IS NOT NULL AND finished_at IS NOT NULL
ORDER BY finished_at DESC, created_at DESC LIMIT 1

-- name: chat_turn_limit_lock
-- Serialise the acceptances that count every live chat turn (chat.per_hub, cluster-wide; scale.md 3.7).
SELECT 1 AS locked

-- name: chat_turn_channel
-- With the submit record (chat.md 5.3 step 8): the gateway channel the turn runs in, its first event number there and
-- the session's runtime id, which a replica taking the turn over adopts (scale.md 4.4).
UPDATE chat_turn SET connection_id = :connection_id, first_seq = :first_seq, runtime_session_id = :runtime_session_id,
                     frame_seq = NULL
WHERE id = :id

-- name: chat_turn_frame_seq
-- The last of the turn's frames whose effect is stored, advanced in the transaction that stores it (scale.md 4.1).
UPDATE chat_turn SET frame_seq = :seq WHERE id = :id AND (frame_seq IS NULL OR frame_seq < :seq)

-- name: chat_turn_waiting_all
-- Every turn queued or pending, of every tenant, oldest first (a restore ends them, operations.md 7.2).
SELECT id FROM chat_turn WHERE state IN ('queued', 'pending') ORDER BY created_at, id
