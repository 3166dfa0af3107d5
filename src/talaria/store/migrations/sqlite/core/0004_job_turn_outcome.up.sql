-- additive: false
-- The job's turn record becomes an explicit state machine (issue 11, defect 9): a finished turn keeps its
-- outcome and reply, so that an attempt after a hub crash between "turn finished" and the job's terminal
-- commit finishes the job from the record instead of opening another Hermes session.
CREATE TABLE job_turn_next (
    job_id              TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    attempt             INTEGER NOT NULL,
    runner_id           TEXT NOT NULL,
    profile             TEXT NOT NULL,
    stored_session_id   TEXT,
    marker              TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('submitting', 'submitted', 'finished')),
    outcome             TEXT CHECK (outcome IN ('complete', 'error', 'interrupted', 'timeout')),
    reply               TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    CHECK ((state = 'finished') = (outcome IS NOT NULL)),
    CHECK (reply IS NULL OR state = 'finished')
);
-- a turn finished before this migration left no outcome: treat it as uncertain (never resubmitted)
INSERT INTO job_turn_next (job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, outcome,
                           reply, created_at, updated_at)
SELECT job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state,
       CASE WHEN state = 'finished' THEN 'interrupted' END, NULL, created_at, updated_at
FROM job_turn;
DROP TABLE job_turn;
ALTER TABLE job_turn_next RENAME TO job_turn;
