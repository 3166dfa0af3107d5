-- additive: true
-- Lifecycle set: jobs with their lease columns, results, idempotency keys, evidence,
-- reconciliations and security events. Can be rolled back without touching the core set.
CREATE TABLE hermes_job (
    id                     TEXT PRIMARY KEY,
    tenant                 TEXT NOT NULL,
    task_id                TEXT NOT NULL UNIQUE,
    dispatch_id            TEXT NOT NULL UNIQUE,
    run_id                 TEXT NOT NULL,
    trace                  TEXT NOT NULL,
    provenance             TEXT NOT NULL,
    cell                   TEXT NOT NULL,
    profile                TEXT NOT NULL,
    state                  TEXT NOT NULL CHECK (state IN ('QUEUED', 'LEASED', 'RUNNING', 'SUCCEEDED',
                               'FAILED', 'CANCELLED')),
    revision               INTEGER NOT NULL CHECK (revision >= 1),
    attempt                INTEGER NOT NULL CHECK (attempt >= 0),
    max_attempts           INTEGER NOT NULL CHECK (max_attempts >= 1),
    max_life_s             INTEGER NOT NULL CHECK (max_life_s >= 1),
    enqueued_at            INTEGER NOT NULL,
    started_at             INTEGER,
    progress               TEXT,
    cancel_requested       INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    cancel_requested_at    INTEGER,
    cancel_requested_by    TEXT,
    finished_at            INTEGER,
    terminal_kind          TEXT,
    terminal_reason        TEXT,
    terminal_lease_id      TEXT,
    terminal_epoch         INTEGER,
    result_digest          TEXT,
    terminal_response      BLOB,
    lease_id               TEXT,
    lease_epoch            INTEGER NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
    lease_owner_principal  TEXT,
    lease_owner_instance   TEXT,
    lease_acquired_at      INTEGER,
    lease_expires_at       INTEGER,
    last_heartbeat_at      INTEGER,
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
    job_id           TEXT PRIMARY KEY REFERENCES hermes_job(id),
    kind             TEXT NOT NULL CHECK (kind IN ('SUCCEEDED', 'FAILED', 'CANCELLED')),
    result_digest    TEXT NOT NULL,
    payload          TEXT NOT NULL,
    lease_id         TEXT,
    lease_epoch      INTEGER NOT NULL,
    principal        TEXT NOT NULL,
    worker_instance  TEXT,
    recorded_at      INTEGER NOT NULL
);

CREATE TABLE idempotency_key (
    principal        TEXT NOT NULL,
    operation        TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    key_hash         TEXT NOT NULL,
    request_digest   TEXT NOT NULL,
    response_status  INTEGER NOT NULL,
    response_body    BLOB NOT NULL,
    revision_after   INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (principal, operation, job_id, key_hash)
);
CREATE INDEX idempotency_key_expiry ON idempotency_key(expires_at);

CREATE TABLE execution_evidence (
    evidence_id      TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES hermes_job(id),
    task_id          TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    dispatch_id      TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('enqueue', 'claim', 'start', 'heartbeat', 'complete',
                         'fail', 'cancel', 'cancel_request', 'requeue', 'expire')),
    payload          TEXT NOT NULL,
    content_digest   TEXT NOT NULL,
    produced_by      TEXT NOT NULL,
    recorded_at      INTEGER NOT NULL,
    audit_event_id   TEXT NOT NULL UNIQUE REFERENCES audit_event(event_id)
);
CREATE INDEX execution_evidence_by_job ON execution_evidence(job_id);

CREATE TABLE reconciliation (
    job_id          TEXT PRIMARY KEY REFERENCES hermes_job(id),
    terminal_kind   TEXT NOT NULL,
    result_digest   TEXT NOT NULL,
    lease_epoch     INTEGER NOT NULL,
    reconciled_at   INTEGER NOT NULL
);

CREATE TABLE security_event (
    id                 TEXT PRIMARY KEY,
    occurred_at        INTEGER NOT NULL,
    peer               TEXT NOT NULL,
    method             TEXT NOT NULL,
    route              TEXT NOT NULL,
    status             INTEGER NOT NULL,
    code               TEXT NOT NULL,
    claimed_principal  TEXT,
    claimed_tenant     TEXT,
    job                TEXT,
    detail             TEXT,
    suppressed_count   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX security_event_by_time ON security_event(occurred_at);
