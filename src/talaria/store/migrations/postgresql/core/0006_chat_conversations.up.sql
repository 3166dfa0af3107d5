-- additive: true
-- Chat, second part (chat.md 2): conversations, each one account's chat with one of its bots.
CREATE TABLE chat_conversation (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    tenant              TEXT COLLATE "C" NOT NULL REFERENCES tenant(name),
    owner               TEXT COLLATE "C" NOT NULL REFERENCES account(username),
    bot_id              TEXT COLLATE "C" NOT NULL REFERENCES bot(id),
    title               TEXT COLLATE "C" NOT NULL,
    title_set           SMALLINT NOT NULL DEFAULT 0 CHECK (title_set IN (0, 1)),
    archived            SMALLINT NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    runner_id           TEXT COLLATE "C",
    hermes_session_id   TEXT COLLATE "C",
    session_reusable    SMALLINT NOT NULL DEFAULT 0 CHECK (session_reusable IN (0, 1)),
    event_seq_reserved  BIGINT NOT NULL DEFAULT 0,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    last_activity_at    BIGINT NOT NULL
);
CREATE INDEX chat_conversation_by_owner ON chat_conversation(tenant, owner, archived, last_activity_at, id);
CREATE INDEX chat_conversation_by_bot ON chat_conversation(bot_id);
