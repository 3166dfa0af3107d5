ALTER TABLE runner DROP COLUMN drain_requested_at;
