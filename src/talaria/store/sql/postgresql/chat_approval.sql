-- name: chat_approval_insert
-- An approval or clarify question Hermes asked during a turn (chat.md 3.5).
INSERT INTO chat_approval (id, turn_id, conversation_id, kind, state, description, command, question, choices,
                           hermes_request_id, created_at)
VALUES (:id, :turn_id, :conversation_id, :kind, 'pending', :description, :command, :question, :choices,
        :hermes_request_id, :now)

-- name: chat_approval_get
-- One approval of a turn.
SELECT * FROM chat_approval WHERE turn_id = :turn_id AND id = :id

-- name: chat_approval_pending
-- A turn's pending approvals, oldest first.
SELECT * FROM chat_approval WHERE turn_id = :turn_id AND state = 'pending' ORDER BY created_at, id

-- name: chat_approval_resolve
-- Resolve a pending approval (approved, denied, answered or expired).
UPDATE chat_approval SET state = :state, choice = :choice, resolved_at = :now
WHERE id = :id AND state = 'pending'
