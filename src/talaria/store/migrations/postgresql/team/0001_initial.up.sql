-- additive: true
-- Team tools (team-tools.md 3): a bot's team permission, teams, goals, assignments and their runs, member sessions,
-- report-back deliveries, the request ledger and the evidence of tool calls. Removable on its own (3.6): team
-- tables may reference core (bot, task, account); nothing references them; job ids carry no foreign key.

-- A bot's team permission and provenance (3.1); no row: false, null.
CREATE TABLE bot_team (
    bot_id              TEXT COLLATE "C" PRIMARY KEY REFERENCES bot(id),
    tenant              TEXT COLLATE "C" NOT NULL,
    owner               TEXT COLLATE "C" NOT NULL,
    team_permission     SMALLINT NOT NULL DEFAULT 0 CHECK (team_permission IN (0, 1)),
    team_revision       BIGINT NOT NULL DEFAULT 0,
    team_granted_by     TEXT COLLATE "C",
    team_granted_at     BIGINT,
    created_by_bot_id   TEXT COLLATE "C",
    created_in_turn_id  TEXT COLLATE "C",
    updated_at          BIGINT NOT NULL
);
CREATE INDEX bot_team_by_creator ON bot_team(created_by_bot_id);

CREATE TABLE team (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    tenant              TEXT COLLATE "C" NOT NULL,
    owner               TEXT COLLATE "C" NOT NULL,
    name                TEXT COLLATE "C" NOT NULL,
    name_key            TEXT COLLATE "C" NOT NULL,
    administrator_id    TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    instructions        TEXT COLLATE "C" NOT NULL DEFAULT '',
    archived            SMALLINT NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    revision            BIGINT NOT NULL DEFAULT 1,
    created_in_turn_id  TEXT COLLATE "C",
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
);
CREATE UNIQUE INDEX team_live_name ON team(administrator_id, name_key) WHERE archived = 0;
CREATE INDEX team_by_owner ON team(tenant, owner, created_at, id);

CREATE TABLE team_member (
    team_id   TEXT COLLATE "C" NOT NULL REFERENCES team(id),
    bot_id    TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    position  BIGINT NOT NULL,
    PRIMARY KEY (team_id, bot_id),
    UNIQUE (team_id, position)
);
CREATE INDEX team_member_by_bot ON team_member(bot_id);

CREATE TABLE goal (
    id                      TEXT COLLATE "C" PRIMARY KEY,
    tenant                  TEXT COLLATE "C" NOT NULL,
    owner                   TEXT COLLATE "C" NOT NULL,
    team_id                 TEXT COLLATE "C" NOT NULL REFERENCES team(id),
    coordinator_id          TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    title                   TEXT COLLATE "C" NOT NULL,
    title_key               TEXT COLLATE "C" NOT NULL,
    objective               TEXT COLLATE "C" NOT NULL,
    status                  TEXT COLLATE "C" NOT NULL CHECK (status IN
                                ('running', 'review', 'waiting', 'blocked', 'complete', 'cancelling', 'cancelled')),
    cause                   TEXT COLLATE "C" CHECK (cause IS NULL OR cause IN
                                ('stopped', 'authority_lost', 'origin_gone', 'restored_from_backup')),
    acceptance_criteria     TEXT COLLATE "C" NOT NULL,
    acceptance_revision     BIGINT NOT NULL DEFAULT 1,
    checks                  TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    result                  TEXT COLLATE "C",
    activation              BIGINT NOT NULL DEFAULT 1,
    revision                BIGINT NOT NULL DEFAULT 1,
    automatic_wakes         BIGINT NOT NULL DEFAULT 0,
    origin_conversation_id  TEXT COLLATE "C" NOT NULL,
    origin_turn_id          TEXT COLLATE "C" NOT NULL,
    team_revision           BIGINT NOT NULL,
    auth_version            BIGINT NOT NULL,
    last_turn_id            TEXT COLLATE "C",
    finish_turn_id          TEXT COLLATE "C",
    wake_turn_id            TEXT COLLATE "C",
    last_signature          TEXT COLLATE "C",
    stopped_by              TEXT COLLATE "C",
    created_at              BIGINT NOT NULL,
    updated_at              BIGINT NOT NULL,
    finished_at             BIGINT
);
-- at most one non-terminal goal per title and team, case-insensitively (3.3: 409 goal_exists)
CREATE UNIQUE INDEX goal_live_title ON goal(team_id, title_key) WHERE status NOT IN ('complete', 'blocked', 'cancelled');
CREATE INDEX goal_by_team ON goal(team_id, created_at, id);
CREATE INDEX goal_by_owner ON goal(tenant, owner, created_at, id);
CREATE INDEX goal_open ON goal(status, created_at, id) WHERE status NOT IN ('complete', 'blocked', 'cancelled');

CREATE TABLE assignment (
    id                   TEXT COLLATE "C" PRIMARY KEY,
    tenant               TEXT COLLATE "C" NOT NULL,
    owner                TEXT COLLATE "C" NOT NULL,
    goal_id              TEXT COLLATE "C" NOT NULL REFERENCES goal(id),
    bot_id               TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    title                TEXT COLLATE "C" NOT NULL,
    brief                TEXT COLLATE "C" NOT NULL,
    acceptance_criteria  TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    depends_on           TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    status               TEXT COLLATE "C" NOT NULL CHECK (status IN
                             ('pending', 'running', 'review', 'failed', 'blocked', 'complete', 'cancelling', 'cancelled')),
    attempt              BIGINT NOT NULL DEFAULT 0,
    max_attempts         BIGINT NOT NULL DEFAULT 3,
    result               TEXT COLLATE "C",
    review               TEXT COLLATE "C",
    task_id              TEXT COLLATE "C",
    job_id               TEXT COLLATE "C",
    revision             BIGINT NOT NULL DEFAULT 1,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);
CREATE INDEX assignment_by_goal ON assignment(goal_id, created_at, id);
CREATE INDEX assignment_running ON assignment(tenant, owner, status) WHERE status IN ('running', 'cancelling');

CREATE TABLE assignment_run (
    assignment_id  TEXT COLLATE "C" NOT NULL REFERENCES assignment(id),
    attempt        BIGINT NOT NULL,
    task_id        TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES task(id),
    job_id         TEXT COLLATE "C" NOT NULL,
    activation     BIGINT NOT NULL,
    dispatched_at  BIGINT NOT NULL,
    settled_at     BIGINT,
    outcome        TEXT COLLATE "C",
    PRIMARY KEY (assignment_id, attempt)
);

CREATE TABLE member_session (
    goal_id            TEXT COLLATE "C" NOT NULL REFERENCES goal(id),
    bot_id             TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    runner_id          TEXT COLLATE "C" NOT NULL,
    stored_session_id  TEXT COLLATE "C" NOT NULL,
    state              TEXT COLLATE "C" NOT NULL CHECK (state IN ('usable', 'retired')),
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (goal_id, bot_id)
);

CREATE TABLE team_delivery (
    id            TEXT COLLATE "C" PRIMARY KEY,
    goal_id       TEXT COLLATE "C" NOT NULL REFERENCES goal(id),
    activation    BIGINT NOT NULL,
    kind          TEXT COLLATE "C" NOT NULL CHECK (kind IN ('review', 'terminal')),
    signature     TEXT COLLATE "C" NOT NULL,
    status        TEXT COLLATE "C" NOT NULL CHECK (status IN ('pending', 'delivered', 'suppressed')),
    goal_status   TEXT COLLATE "C" NOT NULL,
    reason        TEXT COLLATE "C",
    message_id    TEXT COLLATE "C",
    wake_turn_id  TEXT COLLATE "C",
    woke          SMALLINT CHECK (woke IS NULL OR woke IN (0, 1)),
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    UNIQUE (goal_id, activation, kind, signature)
);
CREATE INDEX team_delivery_pending ON team_delivery(created_at, id) WHERE status = 'pending';

CREATE TABLE team_request (
    tenant        TEXT COLLATE "C" NOT NULL,
    owner         TEXT COLLATE "C" NOT NULL,
    request_hash  TEXT COLLATE "C" NOT NULL,
    fingerprint   TEXT COLLATE "C" NOT NULL,
    tool          TEXT COLLATE "C" NOT NULL,
    bot_id        TEXT COLLATE "C" NOT NULL,
    result        TEXT COLLATE "C" NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant, owner, request_hash)
);
CREATE INDEX team_request_expiry ON team_request(expires_at);

CREATE TABLE team_evidence (
    id              TEXT COLLATE "C" PRIMARY KEY,
    audit_event_id  TEXT COLLATE "C" NOT NULL UNIQUE,
    tool            TEXT COLLATE "C" NOT NULL,
    bot_id          TEXT COLLATE "C" NOT NULL,
    turn_id         TEXT COLLATE "C" NOT NULL,
    payload         TEXT COLLATE "C" NOT NULL,
    content_digest  TEXT COLLATE "C" NOT NULL,
    recorded_at     BIGINT NOT NULL
);
