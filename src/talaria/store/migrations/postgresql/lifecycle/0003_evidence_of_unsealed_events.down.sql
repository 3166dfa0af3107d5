-- Refused by PostgreSQL while an evidence row names an event not yet sealed (talaria audit verify seals them).
ALTER TABLE execution_evidence ADD CONSTRAINT execution_evidence_audit_event_id_fkey
    FOREIGN KEY (audit_event_id) REFERENCES audit_event(event_id);
