-- name: job_turn_get
-- The recorded turn of a job, if any.
SELECT * FROM job_turn WHERE job_id = :job_id

-- name: job_turn_begin
-- Record, before prompt.submit, where the job's turn is going (state submitting).
INSERT INTO job_turn (job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, created_at,
                      updated_at)
VALUES (:job_id, :tenant, :attempt, :runner_id, :profile, :stored_session_id, :marker, 'submitting', :now, :now)

-- name: job_turn_mark
-- Move a recorded turn on (submitted, finished) and note the stored session id it is in now.
UPDATE job_turn SET state = :state, stored_session_id = COALESCE(:stored_session_id, stored_session_id),
                    updated_at = :now
WHERE job_id = :job_id
