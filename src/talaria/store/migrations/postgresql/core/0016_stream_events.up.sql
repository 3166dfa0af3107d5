-- additive: true
-- Chat stream events across replicas (scale.md 4.2, 3.7). The replica issuing a conversation's event writes it to
-- stream_event in the transaction of the change it announces (a delta in its own), its id taken from the stream's
-- stream_counter row (UPDATE ... RETURNING): the row lock orders writers until commit, so ids strictly increase per
-- conversation and none is visible before every lower one. A missing counter row starts at the conversation's
-- event_seq_reserved. A stream keeps its latest 2,000 events, and none once idle for 15 minutes (chat.md 4.2).
-- stream_draft holds the live turn's streamed text not stored yet, so that a snapshot read on any replica shows it.
-- stream_open: one row per open event stream, counted per account under the account row's lock; a replica no longer
-- live holds none. Operational: db copy skips all four.
CREATE TABLE stream_counter (
    stream   TEXT COLLATE "C" PRIMARY KEY,
    last_id  BIGINT NOT NULL,
    last_at  BIGINT NOT NULL
);
CREATE INDEX stream_counter_last_at ON stream_counter(last_at);
CREATE TABLE stream_event (
    stream      TEXT COLLATE "C" NOT NULL,
    id          BIGINT NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    PRIMARY KEY (stream, id)
);
CREATE TABLE stream_draft (
    stream      TEXT COLLATE "C" PRIMARY KEY,
    turn_id     TEXT COLLATE "C" NOT NULL,
    message_id  TEXT COLLATE "C" NOT NULL,
    content     TEXT NOT NULL
);
CREATE TABLE stream_open (
    id         TEXT COLLATE "C" PRIMARY KEY,
    account    TEXT COLLATE "C" NOT NULL,
    replica    TEXT COLLATE "C" NOT NULL,
    opened_at  BIGINT NOT NULL
);
CREATE INDEX stream_open_account ON stream_open(account);
CREATE INDEX stream_open_replica ON stream_open(replica);
