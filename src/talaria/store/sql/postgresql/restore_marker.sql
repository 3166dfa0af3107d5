-- name: restore_marker_get
-- The restore marker, if a restore's start steps have not all committed yet (operations.md 7.2).
SELECT restored_at, source, audit_key_sha256, resume_unfinished FROM restore_marker WHERE id = 1

-- name: restore_marker_put
-- Written by db restore or db mark-restored; a second restore before any start replaces the first's.
INSERT INTO restore_marker (id, restored_at, source, audit_key_sha256, resume_unfinished)
VALUES (1, :now, :source, :audit_key_sha256, :resume_unfinished)
ON CONFLICT (id) DO UPDATE SET restored_at = excluded.restored_at, source = excluded.source,
                               audit_key_sha256 = excluded.audit_key_sha256,
                               resume_unfinished = excluded.resume_unfinished

-- name: restore_marker_delete
-- Every start step committed: the marker goes last.
DELETE FROM restore_marker WHERE id = 1
