-- additive: true
-- A chat turn records the gateway channel it runs in (scale.md 4.1, 4.4): connection_id, the turn's first event
-- number on it (first_seq), the session's runtime id, and frame_seq, the last of its frames whose effect is stored.
-- A PostgreSQL replica taking the turn over from a dead owner adopts that channel; a SQLite hub's channels die with
-- it. The columns keep the shared table alike in both dialects.
ALTER TABLE chat_turn ADD COLUMN connection_id TEXT;
ALTER TABLE chat_turn ADD COLUMN first_seq INTEGER;
ALTER TABLE chat_turn ADD COLUMN runtime_session_id TEXT;
ALTER TABLE chat_turn ADD COLUMN frame_seq INTEGER;
CREATE INDEX chat_turn_by_connection ON chat_turn(connection_id) WHERE connection_id IS NOT NULL;
