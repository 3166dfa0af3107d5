-- Refused while events wait to be sealed: dropping them would lose audited changes (talaria audit verify seals them).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM audit_pending) THEN
        RAISE EXCEPTION 'audit events are not yet sealed: run talaria audit verify first';
    END IF;
END;
$$;
DROP TABLE audit_pending;
