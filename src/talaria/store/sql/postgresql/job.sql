-- name: job_insert
-- Enqueue a job (QUEUED, revision 1, epoch 0, attempt 0).
INSERT INTO hermes_job (id, tenant, task_id, dispatch_id, run_id, trace, provenance, cell, profile, state,
                        revision, attempt, max_attempts, max_life_s, enqueued_at, lease_epoch, in_process_only)
VALUES (:id, :tenant, :task_id, :dispatch_id, :run_id, :trace, :provenance, :cell, :profile, 'QUEUED',
        1, 0, :max_attempts, :max_life_s, :now, 0, :in_process_only::int)

-- name: job_get
-- One job of a tenant.
SELECT * FROM hermes_job WHERE tenant = :tenant AND id = :id

-- name: job_get_bound
-- One job of a tenant with its Dispatch and its Task's state and approver (NULL when missing): binding steps 2-4 in one read.
SELECT j.*,
       d.id AS d_id, d.tenant AS d_tenant, d.task_id AS d_task_id, d.job_id AS d_job_id, d.run_id AS d_run_id,
       d.trace AS d_trace, d.provenance AS d_provenance, d.cell AS d_cell, d.profile AS d_profile,
       d.status AS d_status, d.created_by AS d_created_by, d.created_at AS d_created_at,
       d.finished_at AS d_finished_at, d.result_digest AS d_result_digest,
       t.state AS t_state, t.approved_by AS t_approved_by
FROM hermes_job j
LEFT JOIN dispatch d ON d.id = j.dispatch_id
LEFT JOIN task t ON t.tenant = j.tenant AND t.id = j.task_id
WHERE j.tenant = :tenant AND j.id = :id

-- name: job_update
-- Apply one transition: every mutable column, conditional on state and revision (and, for expiry, due and flag).
UPDATE hermes_job SET
    state = :state, revision = :revision, attempt = :attempt, started_at = :started_at, progress = :progress,
    cancel_requested = :cancel_requested::int, cancel_requested_at = :cancel_requested_at,
    cancel_requested_by = :cancel_requested_by, finished_at = :finished_at, terminal_kind = :terminal_kind,
    terminal_reason = :terminal_reason, terminal_lease_id = :terminal_lease_id,
    terminal_epoch = :terminal_epoch, result_digest = :result_digest, terminal_response = :terminal_response,
    lease_id = :lease_id, lease_epoch = :lease_epoch, lease_owner_principal = :lease_owner_principal,
    lease_owner_instance = :lease_owner_instance, lease_acquired_at = :lease_acquired_at,
    lease_expires_at = :lease_expires_at, last_heartbeat_at = :last_heartbeat_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision
  AND (:require_due::int = 0 OR lease_expires_at <= :now)
  AND (:require_no_cancel::int = 0 OR cancel_requested = 0)

-- name: job_claim
-- Row 2: lease a QUEUED job, conditional on state and revision (only the columns a claim changes).
UPDATE hermes_job SET
    state = :state, revision = :revision, attempt = :attempt, lease_id = :lease_id, lease_epoch = :lease_epoch,
    lease_owner_principal = :lease_owner_principal, lease_owner_instance = :lease_owner_instance,
    lease_acquired_at = :lease_acquired_at, lease_expires_at = :lease_expires_at,
    last_heartbeat_at = :last_heartbeat_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision

-- name: job_start
-- Row 3: LEASED to RUNNING with the extended expiry, conditional on state and revision.
UPDATE hermes_job SET
    state = :state, revision = :revision, started_at = :started_at, lease_expires_at = :lease_expires_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision

-- name: job_heartbeat
-- Row 4: renew the lease and keep the progress (the state is unchanged), conditional on state and revision.
UPDATE hermes_job SET
    revision = :revision, progress = :progress, lease_expires_at = :lease_expires_at,
    last_heartbeat_at = :last_heartbeat_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision

-- name: job_finish
-- Rows 5-8: a holder's or an admin's terminal transition, lease cleared, conditional on state and revision.
UPDATE hermes_job SET
    state = :state, revision = :revision, finished_at = :finished_at, terminal_kind = :terminal_kind,
    terminal_reason = :terminal_reason, terminal_lease_id = :terminal_lease_id, terminal_epoch = :terminal_epoch,
    result_digest = :result_digest, terminal_response = :terminal_response, lease_id = :lease_id,
    lease_owner_principal = :lease_owner_principal, lease_owner_instance = :lease_owner_instance,
    lease_acquired_at = :lease_acquired_at, lease_expires_at = :lease_expires_at
WHERE id = :id AND state = :expected_state AND revision = :expected_revision

-- name: job_discover
-- QUEUED (or, for admins, LEASED/RUNNING) jobs of DISPATCHED tasks in one cell and profile, oldest first; through
-- the Runtime API (every_door 0) without the jobs only the in-process dispatcher may see.
SELECT j.* FROM hermes_job j JOIN task t ON t.id = j.task_id
WHERE j.tenant = :tenant AND j.cell = :cell AND j.profile = :profile AND j.state = :state
  AND j.state IN ('QUEUED', 'LEASED', 'RUNNING')
  AND t.state = 'DISPATCHED' AND (:every_door::int = 1 OR j.in_process_only = 0)
ORDER BY j.enqueued_at, j.id
LIMIT :limit

-- name: job_due
-- LEASED or RUNNING jobs whose lease has expired, oldest expiry first.
SELECT * FROM hermes_job
WHERE state IN ('LEASED', 'RUNNING') AND lease_expires_at <= :now
ORDER BY lease_expires_at, id
LIMIT :limit

-- name: job_due_lock
-- The reaper's batch: due jobs as job_due, each held for its transaction; a job another replica's reaper (or a
-- holder's call) holds is skipped, not waited for (scale.md 2.3).
SELECT * FROM hermes_job
WHERE state IN ('LEASED', 'RUNNING') AND lease_expires_at <= :now
ORDER BY lease_expires_at, id
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_list
-- Jobs of a tenant (optionally one state, cell, or task author) with their result payloads and their tasks' titles,
-- newest first, after a cursor.
SELECT j.*, r.payload AS result_payload, t.title AS task_title FROM hermes_job j JOIN task t ON t.id = j.task_id
LEFT JOIN hermes_result r ON r.job_id = j.id
WHERE j.tenant = :tenant
  AND (:state IS NULL OR j.state = :state)
  AND (:cell IS NULL OR j.cell = :cell)
  AND (:created_by IS NULL OR t.created_by = :created_by)
  AND (:cursor_at IS NULL OR j.enqueued_at < :cursor_at OR (j.enqueued_at = :cursor_at AND j.id < :cursor_id))
ORDER BY j.enqueued_at DESC, j.id DESC
LIMIT :limit

-- name: job_terminal_unreconciled
-- Terminal jobs whose Task, Dispatch or Reconciliation row does not hold the same kind (invariant I6).
SELECT j.id FROM hermes_job j
LEFT JOIN reconciliation r ON r.job_id = j.id
LEFT JOIN task t ON t.id = j.task_id
LEFT JOIN dispatch d ON d.id = j.dispatch_id
WHERE j.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
  AND (r.job_id IS NULL OR r.terminal_kind <> j.state OR t.state IS DISTINCT FROM j.state
       OR d.status IS DISTINCT FROM j.state)
LIMIT 10

-- name: job_cancel_requested_among
-- Which of the jobs a replica's dispatcher runs have a cancel requested (scale.md 3.7: talaria_job's fallback).
SELECT id FROM hermes_job WHERE id = ANY(:ids) AND cancel_requested = 1

-- name: job_count_by_state
-- Jobs per state, for talaria_jobs (operations.md 5.1; read at most every 5 s).
SELECT state, COUNT(*) AS n FROM hermes_job GROUP BY state

-- name: job_unended
-- Every job not terminal, of every tenant, oldest first (a restore's cancel, operations.md 7.2).
SELECT tenant, id FROM hermes_job WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') ORDER BY enqueued_at, id
