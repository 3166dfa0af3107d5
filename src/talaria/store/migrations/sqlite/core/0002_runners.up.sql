-- additive: true
-- Execution nodes (runner-protocol.md 2): sources outlive runner re-registration; at most one
-- enabled runner per source within a tenant. Only the token's SHA-256 is stored.
CREATE TABLE source (
    tenant      TEXT NOT NULL REFERENCES tenant(name),
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE runner (
    id                  TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    name                TEXT NOT NULL,
    source              TEXT NOT NULL,
    allowed_profiles    TEXT NOT NULL,
    token_hash          TEXT NOT NULL,
    enabled             INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    server_url          TEXT NOT NULL,
    hermes_url          TEXT NOT NULL,
    artifact_roots      TEXT NOT NULL,
    allow_insecure_lan  INTEGER NOT NULL CHECK (allow_insecure_lan IN (0, 1)),
    created_at          INTEGER NOT NULL,
    disabled_at         INTEGER,
    FOREIGN KEY (tenant, source) REFERENCES source(tenant, name)
);
CREATE UNIQUE INDEX runner_one_enabled_per_source ON runner(tenant, source) WHERE enabled = 1;
CREATE INDEX runner_by_tenant ON runner(tenant, created_at);
