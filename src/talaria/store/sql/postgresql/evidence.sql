-- name: evidence_insert
-- Record the content digest of what a job transition accepted.
INSERT INTO execution_evidence (evidence_id, job_id, task_id, run_id, dispatch_id, kind, payload,
                                content_digest, produced_by, recorded_at, audit_event_id)
VALUES (:evidence_id, :job_id, :task_id, :run_id, :dispatch_id, :kind, :payload, :content_digest,
        :produced_by, :now, :audit_event_id)

-- name: evidence_for_events
-- Evidence rows of the audit events of one job.
SELECT audit_event_id, kind, content_digest FROM execution_evidence WHERE job_id = :job_id

-- name: evidence_get_for_event
-- The evidence row of one audit event.
SELECT kind, content_digest FROM execution_evidence WHERE audit_event_id = :audit_event_id
