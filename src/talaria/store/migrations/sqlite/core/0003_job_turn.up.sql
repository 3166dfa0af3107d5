-- additive: true
-- Where a job's Hermes turn is going (the dispatcher issue): written before prompt.submit, so that a
-- later attempt recovers the turn from Hermes instead of submitting the prompt again. One row per job;
-- the marker is the same for every attempt.
CREATE TABLE job_turn (
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
