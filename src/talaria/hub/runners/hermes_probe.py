"""What the hub learns about a node's Hermes through the runner (runner-protocol.md 11, 12.1): the version and
authentication mode from the public ``GET /api/status``, and team-tool readiness from the plugin's
``GET /api/plugins/talaria/capabilities?profile=``. Both are ordinary ``http`` commands, attributed to the
account that asks."""

from __future__ import annotations

import base64
import json
from typing import Any

from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import AccountRef

CAPABILITIES = "/api/plugins/talaria/capabilities"


def _json(reply: dict[str, Any]) -> Any:
    try:
        return json.loads(base64.b64decode(reply.get("body", "")))
    except ValueError:
        return None


async def hermes_status(channels: Channels, runner_id: str, account: AccountRef) -> dict[str, Any]:
    reply = await channels.http(runner_id, account, "/api/status")
    body = _json(reply)
    return body if reply.get("status") == 200 and isinstance(body, dict) else {}


async def plugin_capabilities(
    channels: Channels, runner_id: str, account: AccountRef, profile: str
) -> tuple[int, dict[str, Any] | None]:
    reply = await channels.http(runner_id, account, CAPABILITIES, search=f"?profile={profile}", profile=profile)
    body = _json(reply)
    return int(reply.get("status", 0)), body if isinstance(body, dict) else None


def plugin_ready(status: int, body: dict[str, Any] | None) -> bool:
    """Ready for team tools: 200 with ``version: 1``, ``ready``, ``in_process`` and ``native_tools`` true."""
    return (
        status == 200
        and body is not None
        and body.get("version") == 1
        and body.get("ready") is True
        and body.get("in_process") is True
        and body.get("native_tools") is True
    )


async def describe(
    channels: Channels, runner_id: str, account: AccountRef, profile: str, *, may_use_profile: bool
) -> dict[str, Any]:
    """The node's Hermes as the hub sees it now (``GET /api/admin/runners/{id}/hermes``). The version needs no
    profile; team-tool readiness is asked only for a profile the account may use there (``checked`` says
    whether it was), so nothing is sent to the node that its validity check would refuse."""
    status = await hermes_status(channels, runner_id, account)
    hermes = {"version": status.get("version"), "authRequired": status.get("auth_required")}
    tools: dict[str, Any] = {"profile": profile, "checked": may_use_profile, "reason": None}
    if may_use_profile:
        code, caps = await plugin_capabilities(channels, runner_id, account, profile)
        found = caps or {}
        missing = found.get("missing", []) if code == 200 else ["plugin"]
        tools |= {"ready": plugin_ready(code, caps), "pluginVersion": found.get("plugin_version"), "missing": missing,
                  "toolSearch": found.get("tool_search"), "inProcess": found.get("in_process")}  # fmt: skip
    else:
        reason = f"you may not use profile {profile} on this node, so its team tools were not checked"
        tools |= {"reason": reason, "ready": False, "pluginVersion": None, "missing": [], "toolSearch": None,
                  "inProcess": None}  # fmt: skip
    return {"runnerId": runner_id, "hermes": hermes, "teamTools": tools}
