-- name: job_turn_get
-- The recorded turn of a job, if any.
SELECT * FROM job_turn WHERE job_id = :job_id

-- name: job_turn_lock
-- The recorded turn of a job, held for the rest of the write transaction (two writers finishing it take turns).
SELECT job_id, state FROM job_turn WHERE job_id = :job_id

-- name: job_turn_begin
-- Record, before prompt.submit, where the job's turn is going (state submitting): its runner, session and channel (the
-- gateway, the first event number of the turn on it, the session's runtime id; scale.md 4.4). With a lease, only
-- while the job is still held under it (scale.md 4.3: an owner's writes are fenced by the job's lease).
INSERT INTO job_turn (job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, created_at,
                      updated_at, connection_id, first_seq, runtime_session_id)
SELECT :job_id, :tenant, :attempt, :runner_id, :profile, :stored_session_id, :marker, 'submitting', :now, :now,
       :connection_id, :first_seq, :runtime_session_id
WHERE (:lease_id IS NULL OR EXISTS (SELECT 1 FROM hermes_job WHERE id = :job_id AND lease_id = :lease_id
                                                 AND lease_epoch = :lease_epoch))
ON CONFLICT (job_id) DO NOTHING

-- name: job_turn_move
-- Move a recorded turn from one state to the next (conditional on the state it is in and, with a lease, on the job
-- being held under it), noting the stored session id it is in now and, when it finished, its outcome and reply.
UPDATE job_turn SET state = :to_state, stored_session_id = COALESCE(:stored_session_id, stored_session_id),
                    outcome = :outcome, reply = :reply, updated_at = :now
WHERE job_id = :job_id AND state = :from_state
  AND (:lease_id IS NULL OR EXISTS (SELECT 1 FROM hermes_job WHERE id = :job_id AND lease_id = :lease_id
                                                 AND lease_epoch = :lease_epoch))
