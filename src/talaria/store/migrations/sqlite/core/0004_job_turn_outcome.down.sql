CREATE TABLE job_turn_prev (
    job_id              TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    attempt             INTEGER NOT NULL,
    runner_id           TEXT NOT NULL,
    profile             TEXT NOT NULL,
    stored_session_id   TEXT,
    marker              TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('submitting', 'submitted', 'finished')),
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
);
INSERT INTO job_turn_prev (job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, created_at,
                           updated_at)
SELECT job_id, tenant, attempt, runner_id, profile, stored_session_id, marker, state, created_at, updated_at
FROM job_turn;
DROP TABLE job_turn;
ALTER TABLE job_turn_prev RENAME TO job_turn;
