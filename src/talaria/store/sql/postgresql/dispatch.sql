-- name: dispatch_insert
-- Persist the decision to run an approved task (status OPEN).
INSERT INTO dispatch (id, tenant, task_id, job_id, run_id, trace, provenance, cell, profile, status,
                      created_by, created_at)
VALUES (:id, :tenant, :task_id, :job_id, :run_id, :trace, :provenance, :cell, :profile, 'OPEN',
        :created_by, :now)

-- name: dispatch_get
-- One dispatch by id.
SELECT * FROM dispatch WHERE id = :id

-- name: dispatch_get_by_task
-- The dispatch of a task, if any.
SELECT * FROM dispatch WHERE task_id = :task_id

-- name: dispatch_finish
-- Move an OPEN dispatch to its terminal status (reconcile only).
UPDATE dispatch SET status = :status, finished_at = :now, result_digest = :result_digest
WHERE id = :id AND status = 'OPEN'
