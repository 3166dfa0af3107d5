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
SELECT * FROM (
    (SELECT NULL::bigint AS seq, p.event_id, p.occurred_at, p.type, p.tenant, p.task_id, p.dispatch_id, p.job_id,
            p.conversation_id, p.bot_id, p.from_state, p.to_state, p.revision_before, p.revision_after,
            p.lease_epoch, p.reason_code, p.body, NULL::text AS prev_hash, NULL::text AS hash,
            e.kind AS evidence_kind, e.content_digest AS evidence_digest, 0 AS sealed, p.pos AS ord
     FROM audit_pending p LEFT JOIN execution_evidence e ON e.audit_event_id = p.event_id
     WHERE p.tenant = :tenant
      AND (:task_id IS NULL OR p.task_id = :task_id)
      AND (:job_id IS NULL OR p.job_id = :job_id)
      AND (:conversation_id IS NULL OR p.conversation_id = :conversation_id)
      AND (:bot_id IS NULL OR p.bot_id = :bot_id)
      AND (:team_id IS NULL OR (p.body::json #>> '{team,teamId}') = :team_id)
      AND (:goal_id IS NULL OR (p.body::json #>> '{team,goalId}') = :goal_id)
       AND :before_seq IS NULL
     ORDER BY p.pos DESC
     LIMIT :limit)
    UNION ALL
    (SELECT a.seq, a.event_id, a.occurred_at, a.type, a.tenant, a.task_id, a.dispatch_id, a.job_id,
            a.conversation_id, a.bot_id, a.from_state, a.to_state, a.revision_before, a.revision_after,
            a.lease_epoch, a.reason_code, a.body, a.prev_hash, a.hash,
            e.kind AS evidence_kind, e.content_digest AS evidence_digest, 1 AS sealed, a.seq AS ord
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
     LIMIT :limit)
) listed
ORDER BY sealed, ord DESC
LIMIT :limit

-- name: audit_pending_insert
-- An audited change's event, not yet chained (scale.md 2.4): its body has no seq; xact is this transaction's id.
INSERT INTO audit_pending (event_id, occurred_at, type, tenant, task_id, dispatch_id, job_id, conversation_id, bot_id, from_state, to_state, revision_before, revision_after, lease_epoch, reason_code, body)
VALUES (:event_id, :occurred_at, :type, :tenant, :task_id, :dispatch_id, :job_id, :conversation_id, :bot_id,
        :from_state, :to_state, :revision_before, :revision_after, :lease_epoch, :reason_code, :body)

-- name: audit_head_lock
-- The chain head, locked for the rest of the sealer's transaction (a second sealer waits here).
SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE

-- name: audit_head_lock_skip
-- The chain head, locked, or no row when another sealer holds it (a sealer's regular round then leaves it be).
SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE SKIP LOCKED

-- name: audit_pending_sealable
-- Up to :limit pending events whose transactions are below this statement's horizon, in (xact, pos) order: every
-- transaction with a lower id has ended and each committed one is visible to this snapshot, so the order is final.
SELECT p.* FROM audit_pending p
WHERE p.xact < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY p.xact, p.pos
LIMIT :limit

-- name: audit_pending_all
-- Up to :limit pending events in (xact, pos) order whatever the horizon: db mark-restored, with no replica writing,
-- on a logical copy whose transaction ids came from the old server (operations.md 7.3).
SELECT p.* FROM audit_pending p
ORDER BY p.xact, p.pos
LIMIT :limit

-- name: audit_pending_delete
-- Sealed events leave the pending table (their positions, as an array).
DELETE FROM audit_pending WHERE pos = ANY(:positions)

-- name: audit_pending_count
-- How many events wait to be sealed, and the age of the oldest (ms since its event occurred).
SELECT COUNT(*) AS n, MIN(occurred_at) AS oldest FROM audit_pending
