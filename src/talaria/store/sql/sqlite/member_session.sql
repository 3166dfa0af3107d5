-- name: member_session_get
-- A goal member's Hermes session (team-tools.md 4.3), if one was kept.
SELECT * FROM member_session WHERE goal_id = :goal_id AND bot_id = :bot_id

-- name: member_session_keep
-- The session an attempt ended in with a reply: usable by the member's next attempt of the goal on that runner.
INSERT INTO member_session (goal_id, bot_id, runner_id, stored_session_id, state, updated_at)
VALUES (:goal_id, :bot_id, :runner_id, :stored_session_id, 'usable', :now)
ON CONFLICT (goal_id, bot_id) DO UPDATE SET
    runner_id = excluded.runner_id, stored_session_id = excluded.stored_session_id, state = 'usable',
    updated_at = excluded.updated_at

-- name: member_session_retire
-- An attempt ended without a reply taken from Hermes: its session is never used again.
UPDATE member_session SET state = 'retired', updated_at = :now WHERE goal_id = :goal_id AND bot_id = :bot_id

-- name: member_session_retire_all
-- A restore: no goal member resumes a kept Hermes session (the node may hold turns after the backup point).
UPDATE member_session SET state = 'retired', updated_at = :now WHERE state <> 'retired'
