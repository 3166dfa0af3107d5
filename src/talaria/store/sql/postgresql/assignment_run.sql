-- name: assignment_run_insert
-- One attempt of an assignment, written in its dispatch transaction: its task can never get a second attempt.
INSERT INTO assignment_run (assignment_id, attempt, task_id, job_id, activation, dispatched_at)
VALUES (:assignment_id, :attempt, :task_id, :job_id, :activation, :now)

-- name: assignment_run_settle
-- The attempt's end, once, as its job ended.
UPDATE assignment_run SET settled_at = :now, outcome = :outcome
WHERE assignment_id = :assignment_id AND attempt = :attempt AND settled_at IS NULL

-- name: assignment_run_of
-- The attempts of an assignment, first first.
SELECT * FROM assignment_run WHERE assignment_id = :assignment_id ORDER BY attempt
