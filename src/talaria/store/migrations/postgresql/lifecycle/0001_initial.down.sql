DROP TABLE security_event;
DROP TABLE reconciliation;
DROP TABLE execution_evidence;
DROP TABLE idempotency_key;
DROP TABLE hermes_result;
DROP TABLE hermes_job;
