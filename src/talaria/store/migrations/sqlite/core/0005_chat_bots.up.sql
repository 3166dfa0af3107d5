-- additive: true
-- Chat, first part (chat.md 2): bots, and the audit columns chat's events are found by.
CREATE TABLE bot (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL REFERENCES tenant(name),
    owner         TEXT NOT NULL REFERENCES account(username),
    name          TEXT NOT NULL,
    name_key      TEXT NOT NULL,
    source        TEXT NOT NULL,
    profile       TEXT NOT NULL,
    instructions  TEXT NOT NULL DEFAULT '',
    archived      INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    revision      INTEGER NOT NULL DEFAULT 1,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE UNIQUE INDEX bot_live_name ON bot(tenant, owner, name_key) WHERE archived = 0;
CREATE INDEX bot_by_owner ON bot(tenant, owner, archived, name_key, id);

ALTER TABLE audit_event ADD COLUMN conversation_id TEXT;
ALTER TABLE audit_event ADD COLUMN bot_id TEXT;
CREATE INDEX audit_by_conversation ON audit_event(conversation_id, seq);
CREATE INDEX audit_by_bot ON audit_event(bot_id, seq);
