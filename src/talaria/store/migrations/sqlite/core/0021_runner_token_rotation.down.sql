ALTER TABLE runner DROP COLUMN rotate_requested_at;
ALTER TABLE runner DROP COLUMN token_next_replaced_at;
ALTER TABLE runner DROP COLUMN token_next_issued_at;
ALTER TABLE runner DROP COLUMN token_next_hash;
ALTER TABLE runner DROP COLUMN token_issued_at;
