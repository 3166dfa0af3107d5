-- additive: true
-- Where a job's Hermes turn is going (the dispatcher issue): written before prompt.submit, so that a
-- later attempt recovers the turn from Hermes instead of submitting the prompt again. One row per job;
-- the marker is the same for every attempt.
CREATE TABLE job_turn (
    job_id              TEXT COLLATE "C" PRIMARY KEY,
    tenant              TEXT COLLATE "C" NOT NULL,
    attempt             BIGINT NOT NULL,
    runner_id           TEXT COLLATE "C" NOT NULL,
    profile             TEXT COLLATE "C" NOT NULL,
    stored_session_id   TEXT COLLATE "C",
    marker              TEXT COLLATE "C" NOT NULL,
    state               TEXT COLLATE "C" NOT NULL CHECK (state IN ('submitting', 'submitted', 'finished')),
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
);
