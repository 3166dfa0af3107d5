-- name: job_turn_get
-- The recorded turn of a job, if any.
SELECT job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, outcome, reply, created_at,
       updated_at
FROM job_turn WHERE job_id = :job_id

-- name: job_turn_lock
-- The recorded turn of a job, held for the rest of the write transaction (two writers finishing it take turns).
SELECT job_id, state FROM job_turn WHERE job_id = :job_id FOR UPDATE

-- name: job_turn_begin
-- Record, before prompt.submit, where the job's turn is going (state submitting).
INSERT INTO job_turn (job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, created_at,
                      updated_at)
VALUES (:job_id, :tenant, :attempt, :runner_id, :profile, :stored_session_id, :marker, 'submitting', :now, :now)
ON CONFLICT (job_id) DO NOTHING

-- name: job_turn_move
-- Move a recorded turn from one state to the next (conditional on the state it is in), noting the stored
-- session id it is in now and, when it finished, its outcome and reply.
UPDATE job_turn SET state = :to_state, stored_session_id = COALESCE(:stored_session_id, stored_session_id),
                    outcome = :outcome, reply = :reply, updated_at = :now
WHERE job_id = :job_id AND state = :from_state
