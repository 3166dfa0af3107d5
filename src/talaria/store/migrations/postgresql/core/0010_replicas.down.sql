DROP TABLE hub_role_lease;
DROP TABLE hub_replica;
