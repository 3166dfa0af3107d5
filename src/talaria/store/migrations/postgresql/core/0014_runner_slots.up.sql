-- additive: true
-- Per-runner limits across replicas (scale.md 3.7): a dispatcher's claim first takes one of a runner's
-- dispatcher.per_runner dispatch_slot rows, and a chat turn one of its chat.per_runner chat_slot rows, whichever
-- replica runs the work. A dispatch slot is free again when its job's lease it was taken under has ended or expired
-- (or, taken for a claim that never recorded its lease, after 30 s); a chat slot when its turn has ended. The owner
-- deletes its row when the work ends; a dead replica's rows are retaken by those rules. Operational: db copy skips
-- them.
CREATE TABLE dispatch_slot (
    runner_id  TEXT COLLATE "C" NOT NULL,
    slot       INTEGER NOT NULL,
    job_id     TEXT COLLATE "C" NOT NULL,
    lease_id   TEXT COLLATE "C",
    taken_at   BIGINT NOT NULL,
    PRIMARY KEY (runner_id, slot)
);
CREATE TABLE chat_slot (
    runner_id  TEXT COLLATE "C" NOT NULL,
    slot       INTEGER NOT NULL,
    turn_id    TEXT COLLATE "C" NOT NULL,
    taken_at   BIGINT NOT NULL,
    PRIMARY KEY (runner_id, slot)
);
