-- additive: true
-- The audit chain under concurrent writers (scale.md 2.4, ADR 0042). An audited transaction inserts its event here,
-- without seq, prev_hash and hash, under its transaction id; the sealer moves events whose transactions are all
-- below the snapshot horizon into audit_event in (xact, pos) order, chained, and deletes them here, in one
-- transaction holding the head. audit_event keeps the shape it has on SQLite: every row in it is sealed.
CREATE TABLE audit_pending (
    pos              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         TEXT COLLATE "C" NOT NULL UNIQUE,
    xact             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    occurred_at      BIGINT NOT NULL,
    type             TEXT COLLATE "C" NOT NULL,
    tenant           TEXT COLLATE "C",
    task_id          TEXT COLLATE "C",
    dispatch_id      TEXT COLLATE "C",
    job_id           TEXT COLLATE "C",
    conversation_id  TEXT COLLATE "C",
    bot_id           TEXT COLLATE "C",
    from_state       TEXT COLLATE "C",
    to_state         TEXT COLLATE "C",
    revision_before  BIGINT,
    revision_after   BIGINT,
    lease_epoch      BIGINT,
    reason_code      TEXT COLLATE "C",
    body             TEXT COLLATE "C" NOT NULL
);
CREATE INDEX audit_pending_by_order ON audit_pending(xact, pos);
