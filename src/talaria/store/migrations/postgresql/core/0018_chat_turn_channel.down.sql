DROP INDEX chat_turn_by_connection;
ALTER TABLE chat_turn DROP COLUMN frame_seq;
ALTER TABLE chat_turn DROP COLUMN runtime_session_id;
ALTER TABLE chat_turn DROP COLUMN first_seq;
ALTER TABLE chat_turn DROP COLUMN connection_id;
