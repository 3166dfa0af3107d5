-- additive: true
-- Adoption of a chat turn's channel (scale.md 4.1, 4.4; ADR 0055). A chat turn records, with its submit record, the
-- gateway channel it runs in (connection_id), the turn's first event number on it (first_seq) and the session's
-- runtime id; frame_seq is the last of its frames whose effect is stored, advanced in the transaction that stores it.
-- The replica taking the turn over adopts the channel and goes on from the frame after frame_seq.
ALTER TABLE chat_turn ADD COLUMN connection_id TEXT COLLATE "C";
ALTER TABLE chat_turn ADD COLUMN first_seq BIGINT;
ALTER TABLE chat_turn ADD COLUMN runtime_session_id TEXT COLLATE "C";
ALTER TABLE chat_turn ADD COLUMN frame_seq BIGINT;
CREATE INDEX chat_turn_by_connection ON chat_turn(connection_id) WHERE connection_id IS NOT NULL;
