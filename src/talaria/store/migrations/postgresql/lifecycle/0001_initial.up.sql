-- additive: true
-- Lifecycle set: jobs with their lease columns, results, idempotency keys, evidence,
-- reconciliations and security events. Can be rolled back without touching the core set.
CREATE TABLE hermes_job (
    id                     TEXT COLLATE "C" PRIMARY KEY,
    tenant                 TEXT COLLATE "C" NOT NULL,
    task_id                TEXT COLLATE "C" NOT NULL UNIQUE,
    dispatch_id            TEXT COLLATE "C" NOT NULL UNIQUE,
    run_id                 TEXT COLLATE "C" NOT NULL,
    trace                  TEXT COLLATE "C" NOT NULL,
    provenance             TEXT COLLATE "C" NOT NULL,
    cell                   TEXT COLLATE "C" NOT NULL,
    profile                TEXT COLLATE "C" NOT NULL,
    state                  TEXT COLLATE "C" NOT NULL CHECK (state IN ('QUEUED', 'LEASED', 'RUNNING', 'SUCCEEDED',
                               'FAILED', 'CANCELLED')),
    revision               BIGINT NOT NULL CHECK (revision >= 1),
    attempt                BIGINT NOT NULL CHECK (attempt >= 0),
    max_attempts           BIGINT NOT NULL CHECK (max_attempts >= 1),
    max_life_s             BIGINT NOT NULL CHECK (max_life_s >= 1),
    enqueued_at            BIGINT NOT NULL,
    started_at             BIGINT,
    progress               TEXT COLLATE "C",
    cancel_requested       SMALLINT NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    cancel_requested_at    BIGINT,
    cancel_requested_by    TEXT COLLATE "C",
    finished_at            BIGINT,
    terminal_kind          TEXT COLLATE "C",
    terminal_reason        TEXT COLLATE "C",
    terminal_lease_id      TEXT COLLATE "C",
    terminal_epoch         BIGINT,
    result_digest          TEXT COLLATE "C",
    terminal_response      BYTEA,
    lease_id               TEXT COLLATE "C",
    lease_epoch            BIGINT NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
    lease_owner_principal  TEXT COLLATE "C",
    lease_owner_instance   TEXT COLLATE "C",
    lease_acquired_at      BIGINT,
    lease_expires_at       BIGINT,
    last_heartbeat_at      BIGINT,
    CHECK (attempt <= max_attempts),
    CHECK (
        (state IN ('LEASED', 'RUNNING')
            AND lease_id IS NOT NULL AND lease_owner_principal IS NOT NULL
            AND lease_owner_instance IS NOT NULL AND lease_acquired_at IS NOT NULL
            AND lease_expires_at IS NOT NULL)
        OR
        (state NOT IN ('LEASED', 'RUNNING')
            AND lease_id IS NULL AND lease_owner_principal IS NULL
            AND lease_owner_instance IS NULL AND lease_acquired_at IS NULL
            AND lease_expires_at IS NULL)
    ),
    CHECK (cancel_requested = 0 OR state <> 'QUEUED')
);
-- Partial indexes: a job enters each only in the states its query asks for, so most transitions
-- touch one index page or none.
CREATE INDEX hermes_job_queue ON hermes_job(tenant, cell, profile, state, enqueued_at, id)
    WHERE state IN ('QUEUED', 'LEASED', 'RUNNING');
CREATE INDEX hermes_job_due ON hermes_job(lease_expires_at) WHERE state IN ('LEASED', 'RUNNING');
CREATE INDEX hermes_job_listing ON hermes_job(tenant, enqueued_at DESC, id DESC);

CREATE TABLE hermes_result (
    job_id           TEXT COLLATE "C" PRIMARY KEY REFERENCES hermes_job(id),
    kind             TEXT COLLATE "C" NOT NULL CHECK (kind IN ('SUCCEEDED', 'FAILED', 'CANCELLED')),
    result_digest    TEXT COLLATE "C" NOT NULL,
    payload          TEXT COLLATE "C" NOT NULL,
    lease_id         TEXT COLLATE "C",
    lease_epoch      BIGINT NOT NULL,
    principal        TEXT COLLATE "C" NOT NULL,
    worker_instance  TEXT COLLATE "C",
    recorded_at      BIGINT NOT NULL
);

CREATE TABLE idempotency_key (
    principal        TEXT COLLATE "C" NOT NULL,
    operation        TEXT COLLATE "C" NOT NULL,
    job_id           TEXT COLLATE "C" NOT NULL,
    key_hash         TEXT COLLATE "C" NOT NULL,
    request_digest   TEXT COLLATE "C" NOT NULL,
    response_status  BIGINT NOT NULL,
    response_body    BYTEA NOT NULL,
    revision_after   BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    PRIMARY KEY (principal, operation, job_id, key_hash)
);
CREATE INDEX idempotency_key_expiry ON idempotency_key(expires_at);

CREATE TABLE execution_evidence (
    evidence_id      TEXT COLLATE "C" PRIMARY KEY,
    job_id           TEXT COLLATE "C" NOT NULL REFERENCES hermes_job(id),
    task_id          TEXT COLLATE "C" NOT NULL,
    run_id           TEXT COLLATE "C" NOT NULL,
    dispatch_id      TEXT COLLATE "C" NOT NULL,
    kind             TEXT COLLATE "C" NOT NULL CHECK (kind IN ('enqueue', 'claim', 'start', 'heartbeat', 'complete',
                         'fail', 'cancel', 'cancel_request', 'requeue', 'expire')),
    payload          TEXT COLLATE "C" NOT NULL,
    content_digest   TEXT COLLATE "C" NOT NULL,
    produced_by      TEXT COLLATE "C" NOT NULL,
    recorded_at      BIGINT NOT NULL,
    audit_event_id   TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES audit_event(event_id)
);
CREATE INDEX execution_evidence_by_job ON execution_evidence(job_id);

CREATE TABLE reconciliation (
    job_id          TEXT COLLATE "C" PRIMARY KEY REFERENCES hermes_job(id),
    terminal_kind   TEXT COLLATE "C" NOT NULL,
    result_digest   TEXT COLLATE "C" NOT NULL,
    lease_epoch     BIGINT NOT NULL,
    reconciled_at   BIGINT NOT NULL
);

CREATE TABLE security_event (
    id                 TEXT COLLATE "C" PRIMARY KEY,
    occurred_at        BIGINT NOT NULL,
    peer               TEXT COLLATE "C" NOT NULL,
    method             TEXT COLLATE "C" NOT NULL,
    route              TEXT COLLATE "C" NOT NULL,
    status             BIGINT NOT NULL,
    code               TEXT COLLATE "C" NOT NULL,
    claimed_principal  TEXT COLLATE "C",
    claimed_tenant     TEXT COLLATE "C",
    job                TEXT COLLATE "C",
    detail             TEXT COLLATE "C",
    suppressed_count   BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX security_event_by_time ON security_event(occurred_at);
