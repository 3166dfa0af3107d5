"""Every numeric limit, with the error code it produces when exceeded (DESIGN.md principle 8)."""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB

# HTTP bodies: web API and Runtime API (web-api.md 1, lifecycle.md 6.4) -> 413 payload_too_large
MAX_BODY_BYTES: Final = 1 * MIB
# Heartbeat progress, canonical JSON size (lifecycle.md 6.4) -> 400 invalid_request
MAX_PROGRESS_BYTES: Final = 4 * KIB
# Runtime API: cancel reason length (lifecycle.md 6.4) -> 400 invalid_request
MAX_CANCEL_REASON_CHARS: Final = 1024
# Binding fields: 1-256 characters each (lifecycle.md 2) -> 400 invalid_request
MAX_BINDING_FIELD_CHARS: Final = 256
# Identity header values (lifecycle.md 6.2) -> 401 proxy_identity_invalid
MAX_IDENTITY_CHARS: Final = 256
# Proxy timestamp skew in seconds (lifecycle.md 6.2) -> 401 proxy_timestamp_skew
MAX_PROXY_SKEW_S: Final = 60
# Minimum proxy secret length in UTF-8 bytes (lifecycle.md 1.1) -> start-up error
MIN_PROXY_SECRET_BYTES: Final = 32
# Idempotency-Key: 1-255 of [A-Za-z0-9_:-] (lifecycle.md 6.6) -> 400 idempotency_key_invalid
MAX_IDEMPOTENCY_KEY_CHARS: Final = 255
# Discovery page size 1-100, default 20 (lifecycle.md 6.4) -> 400 invalid_request
MAX_DISCOVERY_LIMIT: Final = 100
DEFAULT_DISCOVERY_LIMIT: Final = 20
# Reaper: due jobs expired per transaction (lifecycle.md 5)
REAPER_BATCH: Final = 100
# Worker instance: 1-128 of [A-Za-z0-9._:-] -> 400 invalid_request
MAX_WORKER_INSTANCE_CHARS: Final = 128
# Fail error code [a-z0-9_.]{1,64} -> 400 invalid_request
MAX_ERROR_CODE_CHARS: Final = 64

# Web API (web-api.md)
MAX_TASK_TITLE_CHARS: Final = 200  # -> 400 invalid_request
MAX_TASK_PROMPT_CHARS: Final = 200_000  # -> 400 invalid_request
MAX_REJECT_REASON_CHARS: Final = 1000  # -> 400 invalid_request
MAX_USERNAME_CHARS: Final = 64  # -> 400 invalid_request
MIN_PASSWORD_CHARS: Final = 12  # -> 400 weak_password
MAX_PASSWORD_CHARS: Final = 1024  # -> 400 weak_password
MAX_LIST_LIMIT: Final = 100  # -> 400 invalid_request
DEFAULT_LIST_LIMIT: Final = 50
# Login throttling: failures per window, per account and per peer (web-api.md 2) -> 429 login_throttled
# Chat (chat.md 7)
MAX_BOT_NAME_CHARS: Final = 100  # -> 400 invalid_request
MAX_BOT_INSTRUCTIONS_CHARS: Final = 24_000  # -> 400 invalid_request
MAX_LIVE_BOTS: Final = 100  # non-archived bots per account -> 409 bot_limit
MAX_CONVERSATION_TITLE_CHARS: Final = 200  # -> 400 invalid_request
MAX_LIVE_CONVERSATIONS: Final = 500  # non-archived conversations per account -> 409 conversation_limit
MAX_CHAT_TEXT_CHARS: Final = 32_000  # a message's text, an automatic turn's prompt -> 400 invalid_request
MAX_ATTACHMENTS_PER_MESSAGE: Final = 4  # -> 400 invalid_request
MAX_ATTACHMENT_BYTES: Final = 10 * MIB  # an upload's declared length and bytes read -> 413 attachment_too_large
MAX_ATTACHMENT_NAME_CHARS: Final = 255  # -> 400 invalid_request
MAX_UNSENT_ATTACHMENTS: Final = 8  # uploaded or attached, not yet sent, per conversation -> 409 attachment_limit
ATTACHMENT_UNUSED_S: Final = 3600  # an upload in no message for 1 h expires (then 404)
MAX_CLARIFY_ANSWER_CHARS: Final = 4_000  # -> 400 invalid_request
MAX_QUEUED_TURNS: Final = 4  # automatic turns queued per conversation -> 409 turn_queue_full
MAX_ASSISTANT_MESSAGE_CHARS: Final = 1_000_000  # longer replies are cut, suffixed CUT_SUFFIX
MAX_TOOL_TEXT_CHARS: Final = 2_000  # a tool message's context and summary are cut
AUTO_TITLE_CHARS: Final = 80  # a title taken from the first message: its first 80 characters and "…"
CHAT_RETRY_AFTER_S: Final = 5  # Retry-After of 429 chat_turn_limit and chat_busy
CHAT_IDEMPOTENCY_S: Final = 24 * 3600  # an Idempotency-Key of POST …/turns is kept 24 h
# Team tools (team-tools.md 6.2, 8)
MIN_TEAM_MEMBERS: Final = 2  # administrator included -> 400 invalid_members
MAX_TEAM_MEMBERS: Final = 8  # administrator included -> 400 invalid_members
MAX_LIVE_TEAMS_PER_ADMINISTRATOR: Final = 20  # -> 409 team_limit
MAX_OPEN_GOALS_PER_TEAM: Final = 4  # non-terminal goals -> 409 goal_limit
MAX_ASSIGNMENTS_PER_GOAL: Final = 32  # every status and activation -> 409 assignment_limit
ATTEMPTS_PER_ACTIVATION: Final = 3  # maxAttempts at start, +3 per resume -> 409 assignment_retry_limit
MAX_RUNNING_PER_GOAL: Final = 4  # running assignments (goal turns); more stay pending
MAX_RUNNING_PER_ACCOUNT: Final = 10  # running assignments of an owner; more stay pending
MAX_WAKES_PER_ACTIVATION: Final = 8  # automatic wakes; later deliveries post the message without a wake
TEAM_REQUEST_KEEP_S: Final = 30 * 24 * 3600  # a requestId's stored result; a later reuse runs afresh
MAX_TEAM_NAME_CHARS: Final = 100  # name, title, confirmName after trimming -> 400 invalid_request
MAX_TEAM_INSTRUCTIONS_CHARS: Final = 24_000  # -> 400 invalid_request
MAX_GOAL_OBJECTIVE_CHARS: Final = 32_000  # -> 400 invalid_request
MAX_BRIEF_CHARS: Final = 16_000  # brief, a finish's result -> 400 invalid_request
MAX_CRITERIA: Final = 12  # acceptance criteria (1-12 on a goal, 0-12 on an assignment) -> 400 invalid_request
MAX_CRITERION_CHARS: Final = 1_000  # -> 400 invalid_request
MAX_NOTE_CHARS: Final = 4_000  # a review's note -> 400 invalid_request
MAX_REASON_CHARS: Final = 2_000  # reason, a check's evidence, a stop's reason -> 400 invalid_request
MAX_TEAM_ID_CHARS: Final = 128  # requestId and every *Id argument -> 400 invalid_request
MAX_MEMBER_IDS: Final = 7  # memberIds (the administrator makes 8) -> 400 invalid_request
MAX_DEPENDS_ON: Final = 12  # -> 400 invalid_request
MAX_ASSIGNMENT_RESULT_CHARS: Final = 16_000  # the last characters of a member's reply kept as the result
LIST_BOT_INSTRUCTIONS_CHARS: Final = 2_000  # talaria_list_bots cuts each bot's instructions
DEPENDENCY_EXCERPT_CHARS: Final = 1_500  # each dependency's result quoted in an assignment prompt
GOAL_OBJECTIVE_EXCERPT_CHARS: Final = 4_000  # a wake prompt's objective; a terminal message's result
WAKE_RESULT_EXCERPT_CHARS: Final = 1_000  # each assignment's result in a wake prompt
WAKE_ASSIGNMENTS_SHOWN: Final = 12  # the latest assignments a wake prompt lists
# The live stream (chat.md 4, 7)
MAX_CHAT_STREAMS_PER_ACCOUNT: Final = 8  # open event streams per account -> 429 chat_stream_limit
CHAT_EVENTS_RETAINED: Final = 2000  # latest events kept per conversation; older resume points -> stream.reset
CHAT_EVENT_BUFFER_IDLE_S: Final = 15 * 60  # a conversation's buffer is dropped this long after its last event
CHAT_EVENT_ID_BLOCK: Final = 1000  # ids a hub process reserves at a time in chat_conversation.event_seq_reserved
CHAT_STREAM_MAX_BEHIND: Final = 1000  # live events a stream may leave unread before it is ended
CHAT_STREAM_RETRY_MS: Final = 3000  # the stream's ``retry:`` line

LOGIN_MAX_FAILURES: Final = 5
LOGIN_WINDOW_S: Final = 300
# Web sessions: idle and absolute lifetime (web-api.md 2) -> 401 unauthenticated
SESSION_IDLE_S: Final = 12 * 3600
SESSION_MAX_S: Final = 7 * 24 * 3600
