-- name: runner_tool_call_get
-- A call of a grant by its callId, with whether the replica running it is live.
SELECT c.fingerprint, c.status, c.replica, c.attempt, c.outcome, c.outcome_body, (r.id IS NOT NULL) AS live
FROM runner_tool_call c LEFT JOIN hub_replica r ON r.id = c.replica AND r.renewed_at > :since
WHERE c.grant_id = :grant_id AND c.call_id = :call_id

-- name: runner_tool_call_count
-- How many calls a grant has had (the 128-call limit), counted under the grant's row lock.
SELECT COUNT(*) AS n FROM runner_tool_call WHERE grant_id = :grant_id

-- name: runner_tool_call_insert
-- A call begins on this replica.
INSERT INTO runner_tool_call (grant_id, call_id, fingerprint, status, replica, started_at)
VALUES (:grant_id, :call_id, :fingerprint, 'running', :replica, :now)

-- name: runner_tool_call_take_over
-- A running call whose replica is no longer live is run here, at the next attempt.
UPDATE runner_tool_call SET replica = :replica, attempt = attempt + 1, started_at = :now
WHERE grant_id = :grant_id AND call_id = :call_id AND status = 'running' AND attempt = :attempt
RETURNING attempt

-- name: runner_tool_call_finish
-- A call's one outcome, kept only from the attempt that still runs it.
UPDATE runner_tool_call SET status = 'done', outcome = :outcome, outcome_body = :body
WHERE grant_id = :grant_id AND call_id = :call_id AND status = 'running' AND attempt = :attempt

-- name: runner_tool_call_watch
-- The fallback of the tool channel: the calls of these grants, done or whose replica is no longer live.
SELECT c.grant_id, c.call_id FROM runner_tool_call c
LEFT JOIN hub_replica r ON r.id = c.replica AND r.renewed_at > :since
WHERE c.grant_id = ANY(:grant_ids) AND (c.status = 'done' OR r.id IS NULL)
