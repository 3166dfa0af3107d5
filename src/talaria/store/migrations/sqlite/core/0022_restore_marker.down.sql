DROP TABLE restore_marker;
