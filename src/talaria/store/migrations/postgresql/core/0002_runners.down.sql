DROP INDEX runner_by_tenant;
DROP INDEX runner_one_enabled_per_source;
DROP TABLE runner;
DROP TABLE source;
