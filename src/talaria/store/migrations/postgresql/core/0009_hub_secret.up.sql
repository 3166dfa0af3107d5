-- additive: true
-- The hub's keys on PostgreSQL (scale.md 1): the web-session key and the audit key are rows every replica reads, made
-- by the first one (INSERT ... ON CONFLICT DO NOTHING, then read), instead of secret.key and audit.key in each
-- replica's data directory. db copy brings a SQLite hub's files here.
CREATE TABLE hub_secret (
    name        TEXT COLLATE "C" PRIMARY KEY CHECK (name IN ('secret.key', 'audit.key')),
    value       BYTEA NOT NULL CHECK (length(value) = 32),
    created_at  BIGINT NOT NULL
);
