DROP TABLE chat_slot;
DROP TABLE dispatch_slot;
