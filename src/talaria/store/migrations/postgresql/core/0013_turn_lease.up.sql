-- additive: true
-- Who drives each chat turn (scale.md 4.3): a running or pending turn has one owner, the replica holding its
-- turn_lease row. A replica takes a lease that is free, expired, or held by a replica no longer live (the counter
-- grows on each take, so the old holder's writes, fenced by it, fail) and renews what it holds every 10 s for 30 s.
-- Operational: db copy skips it, and a row whose turn has ended is deleted with its release.
CREATE TABLE turn_lease (
    turn_id     TEXT COLLATE "C" PRIMARY KEY,
    holder      TEXT COLLATE "C",
    counter     BIGINT NOT NULL DEFAULT 0,
    expires_at  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX turn_lease_holder ON turn_lease(holder) WHERE holder IS NOT NULL;
