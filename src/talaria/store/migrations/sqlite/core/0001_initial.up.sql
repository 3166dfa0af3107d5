-- additive: true
-- Core set: tenants, accounts, web sessions, tasks, dispatches and the audit chain.
-- No table here has a foreign key into the lifecycle set (lifecycle.md 9.3).
CREATE TABLE tenant (
    name        TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL
);

CREATE TABLE account (
    username          TEXT PRIMARY KEY,
    tenant            TEXT NOT NULL REFERENCES tenant(name),
    role              TEXT NOT NULL CHECK (role IN ('admin', 'user')),
    password_hash     TEXT NOT NULL,
    enabled           INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    allowed_profiles  TEXT NOT NULL DEFAULT '{}',
    can_manage_team   INTEGER NOT NULL DEFAULT 0 CHECK (can_manage_team IN (0, 1)),
    auth_version      INTEGER NOT NULL DEFAULT 1,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE TABLE web_session (
    id_hash       TEXT PRIMARY KEY,
    username      TEXT NOT NULL REFERENCES account(username),
    csrf_token    TEXT NOT NULL,
    auth_version  INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL
);
CREATE INDEX web_session_by_user ON web_session(username);

CREATE TABLE task (
    id                TEXT PRIMARY KEY,
    tenant            TEXT NOT NULL,
    title             TEXT NOT NULL,
    spec              TEXT NOT NULL,
    cell              TEXT NOT NULL,
    profile           TEXT NOT NULL,
    provenance        TEXT,
    trace             TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('DRAFT', 'PENDING_APPROVAL', 'APPROVED', 'REJECTED',
                          'CANCELLED', 'DISPATCHED', 'SUCCEEDED', 'FAILED')),
    revision          INTEGER NOT NULL,
    created_by        TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    submitted_at      INTEGER,
    approved_by       TEXT,
    approved_at       INTEGER,
    rejected_by       TEXT,
    rejected_at       INTEGER,
    rejection_reason  TEXT,
    finished_at       INTEGER
);
CREATE INDEX task_by_tenant ON task(tenant, created_at DESC, id DESC);
CREATE INDEX task_by_state ON task(state);

CREATE TABLE dispatch (
    id             TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL,
    task_id        TEXT NOT NULL UNIQUE REFERENCES task(id),
    job_id         TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    trace          TEXT NOT NULL,
    provenance     TEXT NOT NULL,
    cell           TEXT NOT NULL,
    profile        TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('OPEN', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    created_by     TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    finished_at    INTEGER,
    result_digest  TEXT
);

CREATE TABLE audit_event (
    seq                    INTEGER PRIMARY KEY,
    event_id               TEXT NOT NULL UNIQUE,
    occurred_at            INTEGER NOT NULL,
    type                   TEXT NOT NULL,
    tenant                 TEXT,
    task_id                TEXT,
    dispatch_id            TEXT,
    job_id                 TEXT,
    from_state             TEXT,
    to_state               TEXT,
    revision_before        INTEGER,
    revision_after         INTEGER,
    lease_epoch            INTEGER,
    reason_code            TEXT,
    body                   TEXT NOT NULL,
    prev_hash              TEXT NOT NULL,
    hash                   TEXT NOT NULL
);
CREATE INDEX audit_by_task ON audit_event(task_id, seq);
CREATE INDEX audit_by_job ON audit_event(job_id, seq);

CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON audit_event
BEGIN
    SELECT RAISE(ABORT, 'audit_event is append-only');
END;
CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON audit_event
BEGIN
    SELECT RAISE(ABORT, 'audit_event is append-only');
END;

-- The single chain head: every append reads and moves it in the same transaction.
CREATE TABLE audit_head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
