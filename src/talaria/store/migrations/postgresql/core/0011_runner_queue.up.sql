-- additive: true
-- The runner hub's connection states and command queue in tables, so that any replica serves any runner request
-- (scale.md 3.1-3.3; ADR 0045). An epoch belongs to one runner_conn row and changes exactly when the row is
-- replaced. Every table here is operational: db copy skips them, a restore drops them, maintenance prunes them.
CREATE TABLE runner_conn (
    runner_id       TEXT COLLATE "C" PRIMARY KEY REFERENCES runner(id) ON DELETE CASCADE,
    instance        TEXT COLLATE "C" NOT NULL,
    epoch           TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at      BIGINT NOT NULL,
    seen_at         BIGINT NOT NULL,
    features        TEXT COLLATE "C" NOT NULL DEFAULT '',
    poll_token      TEXT COLLATE "C",
    poll_replica    TEXT COLLATE "C",
    draining_since  BIGINT
);
CREATE INDEX runner_conn_by_seen ON runner_conn(seen_at);
-- gate 6's replaced instances, kept 24 h
CREATE TABLE runner_retired (
    runner_id   TEXT COLLATE "C" NOT NULL REFERENCES runner(id) ON DELETE CASCADE,
    instance    TEXT COLLATE "C" NOT NULL,
    retired_at  BIGINT NOT NULL,
    PRIMARY KEY (runner_id, instance)
);
-- the last request that passed gate 8, kept after the state ends (the nodes page's "Last seen")
CREATE TABLE runner_seen (
    runner_id  TEXT COLLATE "C" PRIMARY KEY REFERENCES runner(id) ON DELETE CASCADE,
    seen_at    BIGINT NOT NULL
);
-- the queue (runner-protocol.md 6.1): one row per command with its one outcome
CREATE TABLE runner_command (
    id                TEXT COLLATE "C" PRIMARY KEY,
    pos               BIGINT GENERATED ALWAYS AS IDENTITY,
    runner_id         TEXT COLLATE "C" NOT NULL,
    epoch             TEXT COLLATE "C" NOT NULL,
    kind              TEXT COLLATE "C" NOT NULL,
    wire              TEXT COLLATE "C" NOT NULL,
    size              BIGINT NOT NULL,
    enqueued_at       BIGINT NOT NULL,
    expires_at        BIGINT NOT NULL,
    account_username  TEXT COLLATE "C",
    account_tenant    TEXT COLLATE "C",
    auth_version      BIGINT,
    profile           TEXT COLLATE "C",
    connection_id     TEXT COLLATE "C",
    grant_id          TEXT COLLATE "C",
    sender_replica    TEXT COLLATE "C" NOT NULL,
    delivered         INTEGER NOT NULL DEFAULT 0,
    next_delivery     BIGINT NOT NULL DEFAULT 0,
    outcome           TEXT COLLATE "C" CHECK (outcome IN ('result', 'error', 'offline', 'uncertain', 'closed')),
    outcome_body      TEXT COLLATE "C",
    settled_at        BIGINT,
    CHECK ((outcome IS NULL) = (settled_at IS NULL))
);
CREATE INDEX runner_command_pending ON runner_command(epoch, pos) WHERE outcome IS NULL;
CREATE INDEX runner_command_of_gateway ON runner_command(connection_id) WHERE outcome IS NULL;
CREATE INDEX runner_command_settled ON runner_command(settled_at) WHERE outcome IS NOT NULL;
