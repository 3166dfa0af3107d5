DROP TABLE turn_lease;
