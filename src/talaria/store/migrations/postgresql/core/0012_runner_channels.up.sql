-- additive: true
-- The runner hub's gateways, grants and accepted frames in tables, so that a runner's admit and event posts are
-- served by any replica and reach the replica that owns the channel (scale.md 3.1, 4.1; ADR 0047). Operational,
-- as the rest of the runner hub's tables: db copy skips them, a restore drops them, maintenance prunes them.
CREATE TABLE runner_gateway (
    id                TEXT COLLATE "C" PRIMARY KEY,
    runner_id         TEXT COLLATE "C" NOT NULL,
    epoch             TEXT COLLATE "C" NOT NULL,
    account_username  TEXT COLLATE "C" NOT NULL,
    account_tenant    TEXT COLLATE "C" NOT NULL,
    auth_version      BIGINT NOT NULL,
    cleanup_only      BOOLEAN NOT NULL,
    owner_replica     TEXT COLLATE "C" NOT NULL,
    owner_counter     BIGINT NOT NULL DEFAULT 1,
    last_seq          BIGINT NOT NULL DEFAULT 0,
    revoked           BOOLEAN NOT NULL DEFAULT FALSE,
    opened_at         BIGINT NOT NULL,
    closed_at         BIGINT
);
CREATE INDEX runner_gateway_open ON runner_gateway(epoch) WHERE closed_at IS NULL;
CREATE INDEX runner_gateway_closed ON runner_gateway(closed_at) WHERE closed_at IS NOT NULL;
-- accepted Hermes frames per (connection, seq); a close marker has no frame
CREATE TABLE runner_event (
    connection_id  TEXT COLLATE "C" NOT NULL REFERENCES runner_gateway(id) ON DELETE CASCADE,
    seq            BIGINT NOT NULL,
    frame          TEXT COLLATE "C",
    closed         BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (connection_id, seq),
    CHECK (closed = (frame IS NULL))
);
CREATE TABLE runner_grant (
    id                TEXT COLLATE "C" PRIMARY KEY,
    runner_id         TEXT COLLATE "C" NOT NULL,
    epoch             TEXT COLLATE "C" NOT NULL,
    account_username  TEXT COLLATE "C" NOT NULL,
    account_tenant    TEXT COLLATE "C" NOT NULL,
    auth_version      BIGINT NOT NULL,
    profile           TEXT COLLATE "C" NOT NULL,
    work_id           TEXT COLLATE "C" NOT NULL,
    owner_replica     TEXT COLLATE "C" NOT NULL,
    owner_counter     BIGINT NOT NULL DEFAULT 1,
    tools             TEXT COLLATE "C",  -- what runs its calls on any replica: {"kind": ..., ...} as JSON
    revoked           BOOLEAN NOT NULL DEFAULT FALSE,
    opened_at         BIGINT NOT NULL,
    closed_at         BIGINT
);
CREATE INDEX runner_grant_open ON runner_grant(epoch) WHERE closed_at IS NULL;
CREATE INDEX runner_grant_closed ON runner_grant(closed_at) WHERE closed_at IS NOT NULL;
-- a grant's tool calls per callId (scale.md 4.3): run once in the cluster, a duplicate answered the first outcome
CREATE TABLE runner_tool_call (
    grant_id      TEXT COLLATE "C" NOT NULL REFERENCES runner_grant(id) ON DELETE CASCADE,
    call_id       TEXT COLLATE "C" NOT NULL,
    fingerprint   TEXT COLLATE "C" NOT NULL,
    status        TEXT COLLATE "C" NOT NULL CHECK (status IN ('running', 'done')),
    replica       TEXT COLLATE "C" NOT NULL,
    attempt       INTEGER NOT NULL DEFAULT 1,
    outcome       TEXT COLLATE "C" CHECK (outcome IN ('result', 'encoded', 'error')),
    outcome_body  TEXT COLLATE "C",
    started_at    BIGINT NOT NULL,
    PRIMARY KEY (grant_id, call_id),
    CHECK ((status = 'done') = (outcome IS NOT NULL))
);
