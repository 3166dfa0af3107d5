-- name: dispatch_slot_take
-- Take slot :slot of a runner for a job about to be claimed (scale.md 3.7): when it is missing, or free: its job's
-- lease it was taken under ended or expired, or no lease was recorded within 30 s of taking it (:stale). A job
-- already holding a slot of this runner takes that one again. No row back: the slot is busy.
INSERT INTO dispatch_slot AS s (runner_id, slot, job_id, lease_id, taken_at)
VALUES (:runner_id, :slot, :job_id, NULL, :now)
ON CONFLICT (runner_id, slot) DO UPDATE SET job_id = :job_id, lease_id = NULL, taken_at = :now
WHERE s.job_id = :job_id
   OR (s.lease_id IS NULL AND s.taken_at <= :stale)
   OR (s.lease_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM hermes_job j WHERE j.id = s.job_id AND j.lease_id = s.lease_id
        AND j.state IN ('LEASED', 'RUNNING') AND j.lease_expires_at > :now))
RETURNING slot

-- name: dispatch_slot_leased
-- The claim taken under the slot: the slot is held while that lease lives.
UPDATE dispatch_slot SET lease_id = :lease_id WHERE runner_id = :runner_id AND slot = :slot AND job_id = :job_id

-- name: dispatch_slot_free
-- The job's work here is over (or its claim was refused): its slot is free at once.
DELETE FROM dispatch_slot WHERE runner_id = :runner_id AND slot = :slot AND job_id = :job_id

-- name: dispatch_slot_drop_job
-- Before a job takes a slot: whatever slot it held before (an earlier attempt's) is given up.
DELETE FROM dispatch_slot WHERE runner_id = :runner_id AND job_id = :job_id

-- name: dispatch_slot_busy
-- How many of a runner's slots 1..:limit are held now (the rules of dispatch_slot_take, read): a job's reason to wait.
SELECT count(*) AS n FROM dispatch_slot s
WHERE s.runner_id = :runner_id AND s.slot <= :limit
  AND ((s.lease_id IS NULL AND s.taken_at > :stale)
       OR (s.lease_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM hermes_job j WHERE j.id = s.job_id AND j.lease_id = s.lease_id
            AND j.state IN ('LEASED', 'RUNNING') AND j.lease_expires_at > :now)))
