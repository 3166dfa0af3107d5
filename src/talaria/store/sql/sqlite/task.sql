-- name: task_insert
-- Create a task in DRAFT.
INSERT INTO task (id, tenant, title, spec, cell, profile, provenance, trace, state, revision, created_by,
                  created_at)
VALUES (:id, :tenant, :title, :spec, :cell, :profile, NULL, :trace, 'DRAFT', 1, :created_by, :now)

-- name: task_get
-- One task of a tenant.
SELECT * FROM task WHERE tenant = :tenant AND id = :id

-- name: task_update
-- Move a task to a new state, conditional on its expected state and revision.
UPDATE task SET state = :state, revision = :revision, provenance = :provenance,
    submitted_at = :submitted_at, approved_by = :approved_by, approved_at = :approved_at,
    rejected_by = :rejected_by, rejected_at = :rejected_at, rejection_reason = :rejection_reason,
    finished_at = :finished_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision

-- name: task_list
-- Tasks of a tenant (optionally of one author and one state), newest first, after a cursor.
SELECT t.*, d.job_id AS job_id FROM task t LEFT JOIN dispatch d ON d.task_id = t.id
WHERE t.tenant = :tenant
  AND (:created_by IS NULL OR t.created_by = :created_by)
  AND (:state IS NULL OR t.state = :state)
  AND (:cursor_at IS NULL OR t.created_at < :cursor_at OR (t.created_at = :cursor_at AND t.id < :cursor_id))
ORDER BY t.created_at DESC, t.id DESC
LIMIT :limit

-- name: task_approved_undispatched
-- APPROVED tasks that have no Dispatch (the start-up guard dispatches them).
SELECT t.* FROM task t LEFT JOIN dispatch d ON d.task_id = t.id
WHERE t.state = 'APPROVED' AND d.id IS NULL
ORDER BY t.approved_at, t.id

-- name: task_lock
-- Hold a task's row for the rest of the transaction (a dispatch checks its revision under it; scale.md 2.3).
SELECT revision FROM task WHERE id = :id
