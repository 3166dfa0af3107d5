-- name: hub_replica_register
-- A replica joins (scale.md 1): its id is new at every start.
INSERT INTO hub_replica (id, release, settings_digest, started_at, renewed_at)
VALUES (:id, :release, :settings_digest, :now, :now)

-- name: hub_replica_renew
-- A replica says it is alive; 0 rows when its row is gone.
UPDATE hub_replica SET renewed_at = :now WHERE id = :id

-- name: hub_replica_leave
-- A replica stopping cleanly leaves; the rows of crashed ones are pruned by the others.
DELETE FROM hub_replica WHERE id = :id

-- name: hub_replica_prune
-- Rows of replicas not live for an hour.
DELETE FROM hub_replica WHERE renewed_at < :before

-- name: hub_replica_live
-- The live replicas (renewed after :since), oldest first.
SELECT id, release, settings_digest, started_at, renewed_at FROM hub_replica WHERE renewed_at > :since
ORDER BY started_at, id

-- name: hub_replica_server_time
-- The database server's clock in ms, to compare a replica's with.
SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint AS now
