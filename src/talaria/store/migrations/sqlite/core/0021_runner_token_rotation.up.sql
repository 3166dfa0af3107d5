-- additive: true
-- Credential rotation (operations.md 4.1): when the current token was issued (NULL: at createdAt), the next token's
-- hash and issue time (never shown), when an unused next was replaced (shown, so a second party rotating is
-- visible), and an admin's request to rotate.
ALTER TABLE runner ADD COLUMN token_issued_at INTEGER;
ALTER TABLE runner ADD COLUMN token_next_hash TEXT;
ALTER TABLE runner ADD COLUMN token_next_issued_at INTEGER;
ALTER TABLE runner ADD COLUMN token_next_replaced_at INTEGER;
ALTER TABLE runner ADD COLUMN rotate_requested_at INTEGER;
