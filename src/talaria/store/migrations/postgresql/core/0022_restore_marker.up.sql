-- additive: true
-- A restore's marker (operations.md 7.2): written by db restore into the restored file, or by db mark-restored into
-- a PostgreSQL database restored with its own tools; the first hub start after it ends sessions, gives runners new
-- epochs and ends unfinished work, and removes the row only once every step committed. At most one row;
-- audit_key_sha256: the backup's audit key (SQLite), so a start can finish a restore interrupted between renames.
CREATE TABLE restore_marker (
    id                  SMALLINT NOT NULL PRIMARY KEY CHECK (id = 1),
    restored_at         BIGINT NOT NULL,
    source              TEXT NOT NULL,
    audit_key_sha256    TEXT,
    resume_unfinished   SMALLINT NOT NULL CHECK (resume_unfinished IN (0, 1))
);
