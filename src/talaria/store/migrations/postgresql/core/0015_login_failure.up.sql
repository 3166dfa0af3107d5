-- additive: true
-- Login throttling across replicas (scale.md 3.7, web-api.md 2): 5 failures in 5 minutes per account and per TCP
-- peer, one row per failure and key (a SHA-256 of the account or the peer, never the name or address itself).
-- Operational: db copy skips it; rows older than the window are deleted with each new failure.
CREATE TABLE login_failure (
    key  TEXT COLLATE "C" NOT NULL,
    at   BIGINT NOT NULL
);
CREATE INDEX login_failure_key ON login_failure(key, at);
CREATE INDEX login_failure_at ON login_failure(at);
