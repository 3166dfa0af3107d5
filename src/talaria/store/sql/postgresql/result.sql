-- name: result_insert
-- Record a job's terminal result (or error, or reason).
INSERT INTO hermes_result (job_id, kind, result_digest, payload, lease_id, lease_epoch, principal,
                           worker_instance, recorded_at)
VALUES (:job_id, :kind, :result_digest, :payload, :lease_id, :lease_epoch, :principal, :worker_instance, :now)

-- name: result_get
-- The result of a job, if it is terminal.
SELECT * FROM hermes_result WHERE job_id = :job_id
