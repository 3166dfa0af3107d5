-- additive: true
-- Hub replicas on one PostgreSQL database (scale.md 1, 3.6; ADR 0044). A replica renews its hub_replica row every
-- 5 s and is live until 20 s after the last renewal; role leases say which replica does the work only one should
-- do (the runner watchdog, the audit sealer, maintenance), taken by a conditional update when free or expired.
-- Both tables are operational: db copy skips them, a restore drops them.
CREATE TABLE hub_replica (
    id               TEXT COLLATE "C" PRIMARY KEY,
    release          TEXT COLLATE "C" NOT NULL,
    settings_digest  TEXT COLLATE "C" NOT NULL,
    started_at       BIGINT NOT NULL,
    renewed_at       BIGINT NOT NULL
);
CREATE TABLE hub_role_lease (
    role        TEXT COLLATE "C" PRIMARY KEY CHECK (role IN ('runner_watchdog', 'audit_sealer', 'maintenance')),
    holder      TEXT COLLATE "C",
    counter     BIGINT NOT NULL DEFAULT 0,
    expires_at  BIGINT NOT NULL DEFAULT 0
);
INSERT INTO hub_role_lease (role) VALUES ('runner_watchdog'), ('audit_sealer'), ('maintenance');
