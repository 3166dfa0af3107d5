-- name: team_evidence_insert
-- The evidence of an applied mutating tool call, beside its audit event (team-tools.md 10).
INSERT INTO team_evidence (id, audit_event_id, tool, bot_id, turn_id, payload, content_digest, recorded_at)
VALUES (:id, :audit_event_id, :tool, :bot_id, :turn_id, :payload, :content_digest, :recorded_at)

-- name: team_evidence_of_event
-- The evidence row of an audit event, if it has one.
SELECT * FROM team_evidence WHERE audit_event_id = :audit_event_id
