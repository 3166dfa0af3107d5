-- name: stream_open_count
-- The account's open event streams on live replicas (scale.md 3.7), under the account row's lock.
SELECT count(*) AS n FROM stream_open o JOIN hub_replica r ON r.id = o.replica
WHERE o.account = :account AND r.renewed_at > :since

-- name: stream_open_insert
-- A stream opened on this replica.
INSERT INTO stream_open (id, account, replica, opened_at) VALUES (:id, :account, :replica, :now)

-- name: stream_open_delete
-- A stream ended.
DELETE FROM stream_open WHERE id = :id

-- name: stream_open_drop_replica
-- A stopping replica's streams are closed.
DELETE FROM stream_open WHERE replica = :replica

-- name: stream_open_sweep
-- Rows of replicas no longer live count for nothing; the maintenance replica deletes them.
DELETE FROM stream_open o
WHERE NOT EXISTS (SELECT 1 FROM hub_replica r WHERE r.id = o.replica AND r.renewed_at > :since)
