-- additive: true
-- Chat, second part (chat.md 2): conversations, each one account's chat with one of its bots.
CREATE TABLE chat_conversation (
    id                  TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL REFERENCES tenant(name),
    owner               TEXT NOT NULL REFERENCES account(username),
    bot_id              TEXT NOT NULL REFERENCES bot(id),
    title               TEXT NOT NULL,
    title_set           INTEGER NOT NULL DEFAULT 0 CHECK (title_set IN (0, 1)),
    archived            INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    runner_id           TEXT,
    hermes_session_id   TEXT,
    session_reusable    INTEGER NOT NULL DEFAULT 0 CHECK (session_reusable IN (0, 1)),
    event_seq_reserved  INTEGER NOT NULL DEFAULT 0,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    last_activity_at    INTEGER NOT NULL
);
CREATE INDEX chat_conversation_by_owner ON chat_conversation(tenant, owner, archived, last_activity_at, id);
CREATE INDEX chat_conversation_by_bot ON chat_conversation(bot_id);
