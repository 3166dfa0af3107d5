-- additive: true
-- Chat, first part (chat.md 2): bots, and the audit columns chat's events are found by.
CREATE TABLE bot (
    id            TEXT COLLATE "C" PRIMARY KEY,
    tenant        TEXT COLLATE "C" NOT NULL REFERENCES tenant(name),
    owner         TEXT COLLATE "C" NOT NULL REFERENCES account(username),
    name          TEXT COLLATE "C" NOT NULL,
    name_key      TEXT COLLATE "C" NOT NULL,
    source        TEXT COLLATE "C" NOT NULL,
    profile       TEXT COLLATE "C" NOT NULL,
    instructions  TEXT COLLATE "C" NOT NULL DEFAULT '',
    archived      SMALLINT NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    revision      BIGINT NOT NULL DEFAULT 1,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE UNIQUE INDEX bot_live_name ON bot(tenant, owner, name_key) WHERE archived = 0;
CREATE INDEX bot_by_owner ON bot(tenant, owner, archived, name_key, id);

ALTER TABLE audit_event ADD COLUMN conversation_id TEXT COLLATE "C";
ALTER TABLE audit_event ADD COLUMN bot_id TEXT COLLATE "C";
CREATE INDEX audit_by_conversation ON audit_event(conversation_id, seq);
CREATE INDEX audit_by_bot ON audit_event(bot_id, seq);
