DROP TABLE stream_open;
DROP TABLE stream_draft;
DROP TABLE stream_event;
DROP TABLE stream_counter;
