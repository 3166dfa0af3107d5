-- name: reconciliation_get
-- The reconciliation of a job, if any.
SELECT * FROM reconciliation WHERE job_id = :job_id

-- name: reconciliation_insert
-- Record that the orchestrator reconciled a terminal job.
INSERT INTO reconciliation (job_id, terminal_kind, result_digest, lease_epoch, reconciled_at)
VALUES (:job_id, :terminal_kind, :result_digest, :lease_epoch, :now)

-- name: reconciliation_broken
-- Jobs breaking I6 (lifecycle.md 7), up to :limit ids: a job has a terminal kind exactly when a Reconciliation row
-- holds it and its Task and Dispatch hold it too; until then the Task is DISPATCHED and the Dispatch OPEN.
SELECT j.id FROM hermes_job j
JOIN task t ON t.id = j.task_id
JOIN dispatch d ON d.id = j.dispatch_id
LEFT JOIN reconciliation r ON r.job_id = j.id
WHERE CASE WHEN j.terminal_kind IS NULL
           THEN r.job_id IS NOT NULL OR t.state <> 'DISPATCHED' OR d.status <> 'OPEN'
           ELSE r.job_id IS NULL OR r.terminal_kind <> j.terminal_kind OR t.state <> j.terminal_kind
                OR d.status <> j.terminal_kind
      END
ORDER BY j.id
LIMIT :limit
