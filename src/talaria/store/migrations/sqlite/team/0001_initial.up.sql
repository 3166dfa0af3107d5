-- additive: true
-- Team tools (team-tools.md 3): a bot's team permission, teams, goals, assignments and their runs, member sessions,
-- report-back deliveries, the request ledger and the evidence of tool calls. Removable on its own (3.6): team
-- tables may reference core (bot, task, account); nothing references them; job ids carry no foreign key.

-- A bot's team permission and provenance (3.1); no row: false, null.
CREATE TABLE bot_team (
    bot_id              TEXT PRIMARY KEY REFERENCES bot(id),
    tenant              TEXT NOT NULL,
    owner               TEXT NOT NULL,
    team_permission     INTEGER NOT NULL DEFAULT 0 CHECK (team_permission IN (0, 1)),
    team_revision       INTEGER NOT NULL DEFAULT 0,
    team_granted_by     TEXT,
    team_granted_at     INTEGER,
    created_by_bot_id   TEXT,
    created_in_turn_id  TEXT,
    updated_at          INTEGER NOT NULL
);
CREATE INDEX bot_team_by_creator ON bot_team(created_by_bot_id);

CREATE TABLE team (
    id                  TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    owner               TEXT NOT NULL,
    name                TEXT NOT NULL,
    name_key            TEXT NOT NULL,
    administrator_id    TEXT NOT NULL REFERENCES bot(id),
    instructions        TEXT NOT NULL DEFAULT '',
    archived            INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    revision            INTEGER NOT NULL DEFAULT 1,
    created_in_turn_id  TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
);
CREATE UNIQUE INDEX team_live_name ON team(administrator_id, name_key) WHERE archived = 0;
CREATE INDEX team_by_owner ON team(tenant, owner, created_at, id);

CREATE TABLE team_member (
    team_id   TEXT NOT NULL REFERENCES team(id),
    bot_id    TEXT NOT NULL REFERENCES bot(id),
    position  INTEGER NOT NULL,
    PRIMARY KEY (team_id, bot_id),
    UNIQUE (team_id, position)
);
CREATE INDEX team_member_by_bot ON team_member(bot_id);

CREATE TABLE goal (
    id                      TEXT PRIMARY KEY,
    tenant                  TEXT NOT NULL,
    owner                   TEXT NOT NULL,
    team_id                 TEXT NOT NULL REFERENCES team(id),
    coordinator_id          TEXT NOT NULL REFERENCES bot(id),
    title                   TEXT NOT NULL,
    title_key               TEXT NOT NULL,
    objective               TEXT NOT NULL,
    status                  TEXT NOT NULL CHECK (status IN
                                ('running', 'review', 'waiting', 'blocked', 'complete', 'cancelling', 'cancelled')),
    cause                   TEXT CHECK (cause IS NULL OR cause IN
                                ('stopped', 'authority_lost', 'origin_gone', 'restored_from_backup')),
    acceptance_criteria     TEXT NOT NULL,
    acceptance_revision     INTEGER NOT NULL DEFAULT 1,
    checks                  TEXT NOT NULL DEFAULT '[]',
    result                  TEXT,
    activation              INTEGER NOT NULL DEFAULT 1,
    revision                INTEGER NOT NULL DEFAULT 1,
    automatic_wakes         INTEGER NOT NULL DEFAULT 0,
    origin_conversation_id  TEXT NOT NULL,
    origin_turn_id          TEXT NOT NULL,
    team_revision           INTEGER NOT NULL,
    auth_version            INTEGER NOT NULL,
    last_turn_id            TEXT,
    finish_turn_id          TEXT,
    wake_turn_id            TEXT,
    last_signature          TEXT,
    stopped_by              TEXT,
    created_at              INTEGER NOT NULL,
    updated_at              INTEGER NOT NULL,
    finished_at             INTEGER
);
-- at most one non-terminal goal per title and team, case-insensitively (3.3: 409 goal_exists)
CREATE UNIQUE INDEX goal_live_title ON goal(team_id, title_key) WHERE status NOT IN ('complete', 'blocked', 'cancelled');
CREATE INDEX goal_by_team ON goal(team_id, created_at, id);
CREATE INDEX goal_by_owner ON goal(tenant, owner, created_at, id);
CREATE INDEX goal_open ON goal(status, created_at, id) WHERE status NOT IN ('complete', 'blocked', 'cancelled');

CREATE TABLE assignment (
    id                   TEXT PRIMARY KEY,
    tenant               TEXT NOT NULL,
    owner                TEXT NOT NULL,
    goal_id              TEXT NOT NULL REFERENCES goal(id),
    bot_id               TEXT NOT NULL REFERENCES bot(id),
    title                TEXT NOT NULL,
    brief                TEXT NOT NULL,
    acceptance_criteria  TEXT NOT NULL DEFAULT '[]',
    depends_on           TEXT NOT NULL DEFAULT '[]',
    status               TEXT NOT NULL CHECK (status IN
                             ('pending', 'running', 'review', 'failed', 'blocked', 'complete', 'cancelling', 'cancelled')),
    attempt              INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL DEFAULT 3,
    result               TEXT,
    review               TEXT,
    task_id              TEXT,
    job_id               TEXT,
    revision             INTEGER NOT NULL DEFAULT 1,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL
);
CREATE INDEX assignment_by_goal ON assignment(goal_id, created_at, id);
CREATE INDEX assignment_running ON assignment(tenant, owner, status) WHERE status IN ('running', 'cancelling');

CREATE TABLE assignment_run (
    assignment_id  TEXT NOT NULL REFERENCES assignment(id),
    attempt        INTEGER NOT NULL,
    task_id        TEXT NOT NULL UNIQUE REFERENCES task(id),
    job_id         TEXT NOT NULL,
    activation     INTEGER NOT NULL,
    dispatched_at  INTEGER NOT NULL,
    settled_at     INTEGER,
    outcome        TEXT,
    PRIMARY KEY (assignment_id, attempt)
);

CREATE TABLE member_session (
    goal_id            TEXT NOT NULL REFERENCES goal(id),
    bot_id             TEXT NOT NULL REFERENCES bot(id),
    runner_id          TEXT NOT NULL,
    stored_session_id  TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('usable', 'retired')),
    updated_at         INTEGER NOT NULL,
    PRIMARY KEY (goal_id, bot_id)
);

CREATE TABLE team_delivery (
    id            TEXT PRIMARY KEY,
    goal_id       TEXT NOT NULL REFERENCES goal(id),
    activation    INTEGER NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('review', 'terminal')),
    signature     TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'suppressed')),
    goal_status   TEXT NOT NULL,
    reason        TEXT,
    message_id    TEXT,
    wake_turn_id  TEXT,
    woke          INTEGER CHECK (woke IS NULL OR woke IN (0, 1)),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (goal_id, activation, kind, signature)
);
CREATE INDEX team_delivery_pending ON team_delivery(created_at, id) WHERE status = 'pending';

CREATE TABLE team_request (
    tenant        TEXT NOT NULL,
    owner         TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    tool          TEXT NOT NULL,
    bot_id        TEXT NOT NULL,
    result        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant, owner, request_hash)
);
CREATE INDEX team_request_expiry ON team_request(expires_at);

CREATE TABLE team_evidence (
    id              TEXT PRIMARY KEY,
    audit_event_id  TEXT NOT NULL UNIQUE,
    tool            TEXT NOT NULL,
    bot_id          TEXT NOT NULL,
    turn_id         TEXT NOT NULL,
    payload         TEXT NOT NULL,
    content_digest  TEXT NOT NULL,
    recorded_at     INTEGER NOT NULL
);
