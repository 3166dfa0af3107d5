DROP INDEX audit_by_bot;
DROP INDEX audit_by_conversation;
ALTER TABLE audit_event DROP COLUMN bot_id;
ALTER TABLE audit_event DROP COLUMN conversation_id;
DROP INDEX bot_by_owner;
DROP INDEX bot_live_name;
DROP TABLE bot;
