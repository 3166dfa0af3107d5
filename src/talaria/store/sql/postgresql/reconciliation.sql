-- name: reconciliation_get
-- The reconciliation of a job, if any.
SELECT * FROM reconciliation WHERE job_id = :job_id

-- name: reconciliation_insert
-- Record that the orchestrator reconciled a terminal job.
INSERT INTO reconciliation (job_id, terminal_kind, result_digest, lease_epoch, reconciled_at)
VALUES (:job_id, :terminal_kind, :result_digest, :lease_epoch, :now)
