-- additive: true
-- An evidence row is written with its audit event, which on PostgreSQL waits in audit_pending until the sealer
-- chains it (scale.md 2.4, ADR 0042): the key to audit_event would refuse it. The event id stays UNIQUE; the event
-- is in audit_pending or audit_event, written in the evidence's own transaction.
ALTER TABLE execution_evidence DROP CONSTRAINT execution_evidence_audit_event_id_fkey;
