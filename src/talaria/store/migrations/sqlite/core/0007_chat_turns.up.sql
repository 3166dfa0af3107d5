-- additive: true
-- Chat, third part (chat.md 2): turns, messages, attachments and approvals of conversations.
CREATE TABLE chat_turn (
    id                    TEXT PRIMARY KEY,
    conversation_id       TEXT NOT NULL REFERENCES chat_conversation(id),
    tenant                TEXT NOT NULL,
    owner                 TEXT NOT NULL,
    state                 TEXT NOT NULL CHECK (state IN
                              ('queued', 'pending', 'running', 'recovering',
                               'completed', 'failed', 'interrupted', 'uncertain')),
    code                  TEXT,
    error                 TEXT,
    waiting_reason        TEXT,
    trigger               TEXT NOT NULL CHECK (trigger IN ('user', 'automatic')),
    trigger_message_id    TEXT NOT NULL,
    reply_message_id      TEXT,
    runner_id             TEXT,
    hermes_session_id     TEXT,
    carry                 TEXT NOT NULL DEFAULT 'none' CHECK (carry IN
                              ('none', 'node-changed', 'session-replaced', 'session-restored')),
    team_tools            INTEGER NOT NULL DEFAULT 0 CHECK (team_tools IN (0, 1)),
    stop_requested        INTEGER NOT NULL DEFAULT 0 CHECK (stop_requested IN (0, 1)),
    auth_version          INTEGER NOT NULL,
    prompt                TEXT,
    marker                TEXT,
    submit_state          TEXT NOT NULL DEFAULT 'none' CHECK (submit_state IN
                              ('none', 'submitting', 'submitted', 'finished')),
    idempotency_key_hash  TEXT,
    request_digest        TEXT,
    response_body         BLOB,
    usage                 TEXT,
    revision              INTEGER NOT NULL DEFAULT 1,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    submitted_at          INTEGER,
    finished_at           INTEGER
);
-- at most one live turn per conversation (chat.md 2)
CREATE UNIQUE INDEX chat_turn_one_live ON chat_turn(conversation_id)
    WHERE state IN ('pending', 'running', 'recovering');
CREATE INDEX chat_turn_by_conversation ON chat_turn(conversation_id, created_at, id);
CREATE INDEX chat_turn_unended ON chat_turn(state, tenant, owner)
    WHERE state IN ('queued', 'pending', 'running', 'recovering');
CREATE INDEX chat_turn_by_key ON chat_turn(conversation_id, idempotency_key_hash)
    WHERE idempotency_key_hash IS NOT NULL;

CREATE TABLE chat_message (
    id               TEXT PRIMARY KEY,
    conversation_id  TEXT NOT NULL REFERENCES chat_conversation(id),
    turn_id          TEXT,
    ordinal          INTEGER NOT NULL,
    role             TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system')),
    author           TEXT NOT NULL,
    content          TEXT NOT NULL,
    reference        TEXT,
    status           TEXT CHECK (status IS NULL OR status IN ('complete', 'interrupted', 'error', 'running', 'done')),
    final            INTEGER NOT NULL DEFAULT 0 CHECK (final IN (0, 1)),
    recovered        INTEGER NOT NULL DEFAULT 0 CHECK (recovered IN (0, 1)),
    tool_id          TEXT,
    tool_name        TEXT,
    tool_context     TEXT,
    tool_summary     TEXT,
    duration_ms      INTEGER,
    usage            TEXT,
    created_at       INTEGER NOT NULL,
    UNIQUE (conversation_id, ordinal)
);
CREATE INDEX chat_message_by_turn ON chat_message(turn_id);

CREATE TABLE chat_attachment (
    id               TEXT PRIMARY KEY,
    conversation_id  TEXT NOT NULL REFERENCES chat_conversation(id),
    name             TEXT NOT NULL,
    media_type       TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('image', 'file')),
    bytes            INTEGER NOT NULL,
    sha256           TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('uploaded', 'attached', 'sent', 'expired')),
    message_id       TEXT,
    data             BLOB,
    runner_id        TEXT,
    node_path        TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX chat_attachment_by_conversation ON chat_attachment(conversation_id, state);
CREATE INDEX chat_attachment_by_message ON chat_attachment(message_id);

CREATE TABLE chat_approval (
    id                 TEXT PRIMARY KEY,
    turn_id            TEXT NOT NULL REFERENCES chat_turn(id),
    conversation_id    TEXT NOT NULL REFERENCES chat_conversation(id),
    kind               TEXT NOT NULL CHECK (kind IN ('approval', 'clarify')),
    state              TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'answered', 'expired')),
    description        TEXT,
    command            TEXT,
    question           TEXT,
    choices            TEXT,
    choice             TEXT,
    hermes_request_id  TEXT,
    created_at         INTEGER NOT NULL,
    resolved_at        INTEGER
);
CREATE INDEX chat_approval_by_turn ON chat_approval(turn_id, created_at, id);
