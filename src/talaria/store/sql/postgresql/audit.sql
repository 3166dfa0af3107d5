-- name: audit_head_get
-- The chain head: last seq and hash.
SELECT seq, hash FROM audit_head WHERE id = 1

-- name: audit_head_set
-- Move the chain head (conditional on the head read in this transaction).
UPDATE audit_head SET seq = :seq, hash = :hash WHERE id = 1 AND seq = :expected_seq

-- name: audit_insert
-- Append one audit event.
INSERT INTO audit_event (seq, event_id, occurred_at, type, tenant, task_id, dispatch_id, job_id, conversation_id,
                         bot_id, from_state, to_state, revision_before, revision_after, lease_epoch, reason_code,
                         body, prev_hash, hash)
VALUES (:seq, :event_id, :occurred_at, :type, :tenant, :task_id, :dispatch_id, :job_id, :conversation_id, :bot_id,
        :from_state, :to_state, :revision_before, :revision_after, :lease_epoch, :reason_code, :body, :prev_hash,
        :hash)

-- name: audit_scan
-- Events in chain order from a seq on, for verification.
SELECT * FROM audit_event WHERE seq > :after_seq ORDER BY seq LIMIT :limit

-- name: audit_list
-- Events of a tenant, optionally of one task, job, conversation, bot, team or goal (the body's team ids,
-- team-tools.md 11), newest first, before a seq cursor.
SELECT a.*, e.kind AS evidence_kind, e.content_digest AS evidence_digest
FROM audit_event a LEFT JOIN execution_evidence e ON e.audit_event_id = a.event_id
WHERE a.tenant = :tenant
  AND (:task_id IS NULL OR a.task_id = :task_id)
  AND (:job_id IS NULL OR a.job_id = :job_id)
  AND (:conversation_id IS NULL OR a.conversation_id = :conversation_id)
  AND (:bot_id IS NULL OR a.bot_id = :bot_id)
  AND (:team_id IS NULL OR (a.body::json #>> '{team,teamId}') = :team_id)
  AND (:goal_id IS NULL OR (a.body::json #>> '{team,goalId}') = :goal_id)
  AND (:before_seq IS NULL OR a.seq < :before_seq)
ORDER BY a.seq DESC
LIMIT :limit
