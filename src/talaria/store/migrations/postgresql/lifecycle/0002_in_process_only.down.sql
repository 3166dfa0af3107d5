ALTER TABLE hermes_job DROP COLUMN in_process_only;
