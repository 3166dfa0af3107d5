-- additive: true
-- Jobs only the in-process dispatcher may see (team-tools.md 4.3: assignment jobs). The Runtime API's discovery
-- leaves them out and a call naming one answers job_not_found, as for an unknown job (ADR 0039).
ALTER TABLE hermes_job ADD COLUMN in_process_only INTEGER NOT NULL DEFAULT 0 CHECK (in_process_only IN (0, 1));
