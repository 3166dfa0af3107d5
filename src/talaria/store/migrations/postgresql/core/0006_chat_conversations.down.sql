DROP INDEX chat_conversation_by_bot;
DROP INDEX chat_conversation_by_owner;
DROP TABLE chat_conversation;
