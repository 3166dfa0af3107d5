-- additive: true
-- Execution nodes (runner-protocol.md 2): sources outlive runner re-registration; at most one
-- enabled runner per source within a tenant. Only the token's SHA-256 is stored.
CREATE TABLE source (
    tenant      TEXT COLLATE "C" NOT NULL REFERENCES tenant(name),
    name        TEXT COLLATE "C" NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE runner (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    tenant              TEXT COLLATE "C" NOT NULL,
    name                TEXT COLLATE "C" NOT NULL,
    source              TEXT COLLATE "C" NOT NULL,
    allowed_profiles    TEXT COLLATE "C" NOT NULL,
    token_hash          TEXT COLLATE "C" NOT NULL,
    enabled             SMALLINT NOT NULL CHECK (enabled IN (0, 1)),
    server_url          TEXT COLLATE "C" NOT NULL,
    hermes_url          TEXT COLLATE "C" NOT NULL,
    artifact_roots      TEXT COLLATE "C" NOT NULL,
    allow_insecure_lan  SMALLINT NOT NULL CHECK (allow_insecure_lan IN (0, 1)),
    created_at          BIGINT NOT NULL,
    disabled_at         BIGINT,
    FOREIGN KEY (tenant, source) REFERENCES source(tenant, name)
);
CREATE UNIQUE INDEX runner_one_enabled_per_source ON runner(tenant, source) WHERE enabled = 1;
CREATE INDEX runner_by_tenant ON runner(tenant, created_at);
