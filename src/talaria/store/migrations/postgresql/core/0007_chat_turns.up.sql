-- additive: true
-- Chat, third part (chat.md 2): turns, messages, attachments and approvals of conversations.
CREATE TABLE chat_turn (
    id                    TEXT COLLATE "C" PRIMARY KEY,
    conversation_id       TEXT COLLATE "C" NOT NULL REFERENCES chat_conversation(id),
    tenant                TEXT COLLATE "C" NOT NULL,
    owner                 TEXT COLLATE "C" NOT NULL,
    state                 TEXT COLLATE "C" NOT NULL CHECK (state IN
                              ('queued', 'pending', 'running', 'recovering',
                               'completed', 'failed', 'interrupted', 'uncertain')),
    code                  TEXT COLLATE "C",
    error                 TEXT COLLATE "C",
    waiting_reason        TEXT COLLATE "C",
    trigger               TEXT COLLATE "C" NOT NULL CHECK (trigger IN ('user', 'automatic')),
    trigger_message_id    TEXT COLLATE "C" NOT NULL,
    reply_message_id      TEXT COLLATE "C",
    runner_id             TEXT COLLATE "C",
    hermes_session_id     TEXT COLLATE "C",
    carry                 TEXT COLLATE "C" NOT NULL DEFAULT 'none' CHECK (carry IN
                              ('none', 'node-changed', 'session-replaced', 'session-restored')),
    team_tools            SMALLINT NOT NULL DEFAULT 0 CHECK (team_tools IN (0, 1)),
    stop_requested        SMALLINT NOT NULL DEFAULT 0 CHECK (stop_requested IN (0, 1)),
    auth_version          BIGINT NOT NULL,
    prompt                TEXT COLLATE "C",
    marker                TEXT COLLATE "C",
    submit_state          TEXT COLLATE "C" NOT NULL DEFAULT 'none' CHECK (submit_state IN
                              ('none', 'submitting', 'submitted', 'finished')),
    idempotency_key_hash  TEXT COLLATE "C",
    request_digest        TEXT COLLATE "C",
    response_body         BYTEA,
    usage                 TEXT COLLATE "C",
    revision              BIGINT NOT NULL DEFAULT 1,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    submitted_at          BIGINT,
    finished_at           BIGINT
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
    id               TEXT COLLATE "C" PRIMARY KEY,
    conversation_id  TEXT COLLATE "C" NOT NULL REFERENCES chat_conversation(id),
    turn_id          TEXT COLLATE "C",
    ordinal          BIGINT NOT NULL,
    role             TEXT COLLATE "C" NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system')),
    author           TEXT COLLATE "C" NOT NULL,
    content          TEXT COLLATE "C" NOT NULL,
    reference        TEXT COLLATE "C",
    status           TEXT COLLATE "C"
                         CHECK (status IS NULL OR status IN ('complete', 'interrupted', 'error', 'running', 'done')),
    final            SMALLINT NOT NULL DEFAULT 0 CHECK (final IN (0, 1)),
    recovered        SMALLINT NOT NULL DEFAULT 0 CHECK (recovered IN (0, 1)),
    tool_id          TEXT COLLATE "C",
    tool_name        TEXT COLLATE "C",
    tool_context     TEXT COLLATE "C",
    tool_summary     TEXT COLLATE "C",
    duration_ms      BIGINT,
    usage            TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    UNIQUE (conversation_id, ordinal)
);
CREATE INDEX chat_message_by_turn ON chat_message(turn_id);

CREATE TABLE chat_attachment (
    id               TEXT COLLATE "C" PRIMARY KEY,
    conversation_id  TEXT COLLATE "C" NOT NULL REFERENCES chat_conversation(id),
    name             TEXT COLLATE "C" NOT NULL,
    media_type       TEXT COLLATE "C" NOT NULL,
    kind             TEXT COLLATE "C" NOT NULL CHECK (kind IN ('image', 'file')),
    bytes            BIGINT NOT NULL,
    sha256           TEXT COLLATE "C" NOT NULL,
    state            TEXT COLLATE "C" NOT NULL CHECK (state IN ('uploaded', 'attached', 'sent', 'expired')),
    message_id       TEXT COLLATE "C",
    data             BYTEA,
    runner_id        TEXT COLLATE "C",
    node_path        TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX chat_attachment_by_conversation ON chat_attachment(conversation_id, state);
CREATE INDEX chat_attachment_by_message ON chat_attachment(message_id);

CREATE TABLE chat_approval (
    id                 TEXT COLLATE "C" PRIMARY KEY,
    turn_id            TEXT COLLATE "C" NOT NULL REFERENCES chat_turn(id),
    conversation_id    TEXT COLLATE "C" NOT NULL REFERENCES chat_conversation(id),
    kind               TEXT COLLATE "C" NOT NULL CHECK (kind IN ('approval', 'clarify')),
    state              TEXT COLLATE "C" NOT NULL
                           CHECK (state IN ('pending', 'approved', 'denied', 'answered', 'expired')),
    description        TEXT COLLATE "C",
    command            TEXT COLLATE "C",
    question           TEXT COLLATE "C",
    choices            TEXT COLLATE "C",
    choice             TEXT COLLATE "C",
    hermes_request_id  TEXT COLLATE "C",
    created_at         BIGINT NOT NULL,
    resolved_at        BIGINT
);
CREATE INDEX chat_approval_by_turn ON chat_approval(turn_id, created_at, id);
