"""Every error that reaches a client: a stable ``code``, an HTTP status and a message for people.

Hierarchy::

    TalariaError                      code + status + message (+ optional headers)
    ├── StoreUnavailable              503 store_unavailable, Retry-After: 1 (busy, I/O, failed audit insert)
    └── SettingsError                 a broken hub setting (start-up error, not an HTTP answer)

One exception class carries every code: the code decides the status through ``STATUS_BY_CODE``,
so an answer's status can never drift from its code. Codes and the rule or limit that produces
them are listed in ``STATUS_BY_CODE`` (rules) and ``talaria.limits`` (numeric limits).
Messages never hold secrets, signatures or request bodies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

STATUS_BY_CODE: Mapping[str, int] = {
    # request shape
    "invalid_request": 400,
    "idempotency_key_required": 400,
    "idempotency_key_invalid": 400,
    "weak_password": 400,
    # Runtime API identity (lifecycle.md 6.2)
    "proxy_identity_missing": 401,
    "proxy_identity_invalid": 401,
    "proxy_timestamp_skew": 401,
    "proxy_signature_invalid": 401,
    # web sessions (web-api.md 2)
    "unauthenticated": 401,
    "invalid_credentials": 401,
    "peer_not_allowed": 403,
    "role_forbidden": 403,
    "self_approval_forbidden": 403,
    "csrf_failed": 403,
    "admin_required": 403,
    "not_author": 403,
    "not_found": 404,
    "job_not_found": 404,
    "method_not_allowed": 405,
    "payload_too_large": 413,
    "request_timeout": 408,  # ADR 0063: the headers or body did not arrive in time (hub/connection_deadlines.py)
    # state conflicts (lifecycle.md 4-7)
    "dispatch_missing": 409,
    "not_approved": 409,
    "already_leased": 409,
    "invalid_transition": 409,
    "lease_expired": 409,
    "stale_lease": 409,
    "lease_mismatch": 409,
    "terminal_conflict": 409,
    "reconcile_rejected": 409,
    "account_exists": 409,
    "last_admin": 409,
    # a (source, profile) the account may not use (issue 12 items 4 and 16)
    "profile_not_allowed": 403,
    "idempotency_key_reused": 422,
    "login_throttled": 429,
    "internal_error": 500,
    "store_unavailable": 503,
    # a PostgreSQL replica whose clock strays from the database server's (scale.md 1)
    "clock_skew": 503,
    # runner registration (runner-protocol.md 2)
    "invalid_assigned_profiles": 400,
    "invalid_runner_config": 400,
    "runner_source_in_use": 409,
    # runner machine API gate and ops (runner-protocol.md 4-6, 12.5)
    "invalid_json": 400,
    "runner_unauthorized": 403,
    "runner_protocol_mismatch": 409,
    "runner_instance_changed": 409,
    "runner_instance_retired": 409,
    "runner_instance_limit": 409,
    "runner_event_gap": 409,
    "runner_epoch_changed": 409,
    "runner_rotation_not_due": 409,  # operations.md 4.1: the rotate op when neither an admin nor the token's age asks
    "runner_payload_limit": 413,
    "runner_grant_expired": 410,
    "idempotency_conflict": 409,
    "runner_call_limit": 429,
    "hub_shutting_down": 503,
    "hub_draining": 503,  # operations.md 3.4: a planned restart; new turns wait for it (Retry-After: 1)
    # outcomes of hub operations that send commands (runner-protocol.md 6.1, 14)
    "runner_offline": 503,
    "runner_draining": 503,  # operations.md 3.2: the node takes no new work
    "runner_busy": 429,
    "runner_command_not_admitted": 403,
    "runner_command_uncertain": 504,
    "runner_feature_required": 409,
    "runner_profile_forbidden": 403,
    "runner_session_forbidden": 403,
    "runner_http_forbidden": 403,
    "runner_artifact_forbidden": 403,
    "runner_cleanup_forbidden": 403,
    "runner_session_busy": 409,
    "runner_target_changed": 409,
    "restored_from_backup": 409,  # operations.md 7.2: a chat turn queued or pending at a restored backup's point
    "team_tools_unavailable": 409,
    # a turn reached turns.max_turn_s (or its lease's last renewal) and was interrupted (ADR 0020)
    "turn_timeout": 504,
    # the account behind a turn lost its access (disabled, auth_version changed, profile removed)
    "access_revoked": 403,
    "team_tools_forbidden": 403,
    # chat (chat.md 3.6)
    "bot_not_allowed": 403,
    "duplicate_bot_name": 409,
    "bot_limit": 409,
    "bot_archived": 409,
    "conversation_limit": 409,
    "conversation_archived": 409,
    "turn_in_progress": 409,
    "turn_finished": 409,
    "turn_queue_full": 409,
    "attachment_limit": 409,
    "attachment_used": 409,
    "approval_expired": 409,
    "approval_out_of_order": 409,
    "attachment_too_large": 413,
    "attachment_kind_unsupported": 415,
    "chat_turn_limit": 429,
    "chat_busy": 429,
    "chat_stream_limit": 429,
    # team tools (team-tools.md 9)
    "invalid_members": 400,
    "invalid_assignment_bot": 400,
    "invalid_assignment_dependency": 400,
    "bot_name_mismatch": 400,
    "team_forbidden": 403,
    "goal_forbidden": 403,
    "bot_creator_required": 403,
    "user_instruction_required": 403,
    "team_permission_forbidden": 403,
    "duplicate_team_name": 409,
    "bot_unavailable": 409,
    "bot_in_use": 409,
    "team_busy": 409,
    "goal_exists": 409,
    "goal_not_active": 409,
    "goal_criteria_changed": 409,
    "goal_incomplete": 409,
    "goal_checks_missing": 409,
    "goal_not_resumable": 409,
    "goal_still_running": 409,
    "assignment_not_reviewable": 409,
    "assignment_not_cancellable": 409,
    "assignment_retry_limit": 409,
    "assignment_limit": 409,
    "team_limit": 409,
    "goal_limit": 409,
}

# Runner-reported codes without a status of their own are relayed as 502 (runner-protocol.md 14).
RELAYED_RUNNER_STATUS = 502

# binding_mismatch is 403 for tenant/principal differences and 409 otherwise (lifecycle.md 6.3);
# runner_connection_closed is 410 on the event op and 409 for a hub operation whose channel closed.
_DUAL_STATUS = {"binding_mismatch", "runner_connection_closed"}
# Codes a runner reports that reach a hub caller as 502 with the code (runner-protocol.md 14).
RUNNER_RELAYED = frozenset(
    {"hermes_unavailable", "gateway_rejected", "team_tools_bind_failed", "runner_command_forbidden"}
)
_CODE_SYNTAX = re.compile(r"^[a-z0-9_.]{1,64}\Z")


class TalariaError(Exception):
    """An error with a stable code. ``status`` follows from the code unless the code has two."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if code in _DUAL_STATUS:
            if status is None:
                raise ValueError(f"{code} needs an explicit status")
        elif code in RUNNER_RELAYED:
            status = RELAYED_RUNNER_STATUS if status is None else status
        elif code not in STATUS_BY_CODE:
            raise ValueError(f"unknown error code {code!r}")
        self.code = code
        self.message = message
        self.status = status if status is not None else STATUS_BY_CODE[code]
        self.headers = dict(headers or {})

    def body(self) -> dict[str, str]:
        return {"code": self.code, "error": self.message}

    def __repr__(self) -> str:
        return f"TalariaError({self.code!r}, {self.message!r}, status={self.status})"


class StoreUnavailable(TalariaError):
    """The store could not commit (busy after the timeout, I/O error, failed audit/evidence insert)."""

    def __init__(self, message: str = "the store is unavailable; retry") -> None:
        super().__init__("store_unavailable", message, headers={"Retry-After": "1"})


class StoreConflict(StoreUnavailable):
    """PostgreSQL gave up the transaction for a concurrent one (40001 serialization failure, 40P01 deadlock): it
    rolled back and may simply be run again (scale.md 2.3: retried 3 times, then 503)."""


RETRIED_CONFLICTS = 3  # attempts of a write that keeps meeting StoreConflict before its 503


class SettingsError(Exception):
    """A broken hub setting; the message names the key. Raised before any socket is bound."""


def all_codes() -> frozenset[str]:
    return frozenset(STATUS_BY_CODE) | _DUAL_STATUS | RUNNER_RELAYED


def relayed(code: str, message: str) -> TalariaError:
    """A runner-reported error as a hub caller sees it (runner-protocol.md 14): its own status if the
    code has one, else 502 with the runner's code (an unparseable code becomes ``runner_error``)."""
    if code == "runner_connection_closed":
        return TalariaError(code, message, status=409)
    if code in STATUS_BY_CODE or code in RUNNER_RELAYED:
        return TalariaError(code, message)
    error = TalariaError("gateway_rejected", message)
    error.code = code if _CODE_SYNTAX.match(code) else "runner_error"
    return error
