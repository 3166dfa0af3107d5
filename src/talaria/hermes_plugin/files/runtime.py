"""Talaria's Hermes plugin runtime (hermes.md 8): the binding table, bind, unbind, the tool handler and the
guards. Loaded once per Hermes process under the fixed module name ``talaria_hermes_runtime`` by both the
agent part and the routes, so they share one table.

Everything here uses Hermes 0.19.0 internals (``tui_gateway.server._sessions``, the tool registry, the MCP
refresh, the home override), looked up at run time; ``capabilities`` names whichever is missing, and
nothing binds unless all are present. Standard library and Hermes modules only.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

PLUGIN_VERSION = "1"
TEAM_TOOL = re.compile(r"^team_[0-9a-f]{32}\Z")
TEAM_TOOLSET = re.compile(r"^teamrt_[0-9a-f]{16}\Z")  # a binding's private toolset
BRIDGE = re.compile(r"^http://127\.0\.0\.1:([0-9]{1,5})\Z")
PROFILE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")
MAX_AHEAD_MS = 30 * 60 * 1000
BIND_BUDGET_S = 60.0
CALL_TIMEOUT_S = 300.0
MAX_TOOLS = 256

STATE: dict[str, Any] = {"hooks_loaded": False}
_lock = threading.RLock()


@dataclass
class Binding:
    runtime_id: str
    stored_id: str
    profile: str
    generation: str
    bridge_url: str
    token: str
    expires_at: int
    toolset: str
    tools: list[str] = field(default_factory=list)
    original_toolsets: list[str] | None = None
    timer: threading.Timer | None = None


_bindings: dict[str, Binding] = {}  # runtime id -> binding


class Refused(Exception):
    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(error)
        self.status, self.code, self.error = status, code, error


def _now_ms() -> int:
    return int(time.time() * 1000)


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _attr(module: ModuleType | None, name: str) -> Any:
    return getattr(module, name, None) if module is not None else None


# --- capabilities ----------------------------------------------------------------------------------------------


def _internals() -> dict[str, Any]:
    server = _module("tui_gateway.server")
    registry_module = _module("tools.registry")
    plugins = _module("hermes_cli.plugins")
    middleware = _module("hermes_cli.middleware")
    registry = _attr(registry_module, "registry")
    return {
        "_sessions": _attr(server, "_sessions"),
        "_sessions_lock": _attr(server, "_sessions_lock"),
        "_start_agent_build": _attr(server, "_start_agent_build"),
        "registry.register": _attr(registry, "register"),
        "registry.deregister": _attr(registry, "deregister"),
        "registry.get_toolset_for_tool": _attr(registry, "get_toolset_for_tool"),
        "refresh_agent_mcp_tools": _attr(_module("tools.mcp_tool"), "refresh_agent_mcp_tools"),
        "get_tool_definitions": _attr(_module("model_tools"), "get_tool_definitions"),
        "set_hermes_home_override": _attr(_module("hermes_constants"), "set_hermes_home_override"),
        "reset_hermes_home_override": _attr(_module("hermes_constants"), "reset_hermes_home_override"),
        "get_hermes_home": _attr(_module("hermes_constants"), "get_hermes_home"),
        "hook:pre_tool_call": "pre_tool_call" in (_attr(plugins, "VALID_HOOKS") or ()) or None,
        "hook:on_session_finalize": "on_session_finalize" in (_attr(plugins, "VALID_HOOKS") or ()) or None,
        "middleware:llm_request": "llm_request" in (_attr(middleware, "VALID_MIDDLEWARE") or ()) or None,
        "server": server,
        "registry": registry,
    }


def _launch_home() -> Path:
    get_home = _internals()["get_hermes_home"]
    return Path(get_home()) if get_home is not None else Path.home() / ".hermes"


def _profile_home(profile: str) -> str | None:
    return None if profile == "default" else str(_launch_home() / "profiles" / profile)


def _with_home(profile: str, work: Any) -> Any:
    """Run ``work()`` under the profile's home override (the launch home needs none)."""
    home = _profile_home(profile)
    if home is None:
        return work()
    internals = _internals()
    token = internals["set_hermes_home_override"](home)
    try:
        return work()
    finally:
        internals["reset_hermes_home_override"](token)


def _turn_isolation() -> bool:
    server = _internals()["server"]
    loader = _attr(server, "_load_dashboard_process_isolation_config")
    if loader is None:
        return True  # unknown: assume turns may leave this process
    try:
        return bool(loader().get("turn_isolation"))
    except Exception:
        return True


def _tool_search(profile: str) -> str:
    module = _module("tools.tool_search")
    load = _attr(module, "load_config")
    if load is None:
        return "unknown"
    try:
        return str(_with_home(profile, lambda: load().enabled))
    except Exception:
        return "unknown"


def capabilities(profile: str = "default") -> dict[str, Any]:
    internals = _internals()
    missing = [name for name, value in internals.items() if value is None and name not in ("server", "registry")]
    if not PROFILE.match(profile or ""):
        missing.append("profile")
    in_process = not _turn_isolation()
    tool_search = _tool_search(profile) if PROFILE.match(profile or "") else "unknown"
    try:
        hermes_version = importlib.metadata.version("hermes-agent")
    except importlib.metadata.PackageNotFoundError:
        hermes_version = None
    hooks = bool(STATE.get("hooks_loaded"))
    return {
        "version": 1,
        "plugin_version": PLUGIN_VERSION,
        "hermes_version": hermes_version,
        "ready": not missing and hooks and in_process and tool_search == "off",
        "in_process": in_process,
        "native_tools": True,
        "tool_plugin_loaded": hooks,
        "turn_isolation": not in_process,
        "tool_search": tool_search,
        "missing": missing,
    }


# --- sessions --------------------------------------------------------------------------------------------------


def _session(runtime_id: str) -> dict[str, Any] | None:
    internals = _internals()
    with internals["_sessions_lock"]:
        session = internals["_sessions"].get(runtime_id)
    return session if isinstance(session, dict) else None


def _stored_of(session: dict[str, Any]) -> str | None:
    agent = session.get("agent")
    stored = getattr(agent, "session_id", None) if agent is not None else None
    return str(stored or session.get("session_key") or "") or None


def _profile_of(session: dict[str, Any]) -> str | None:
    home = session.get("profile_home")
    if not home:
        return "default"
    path = Path(str(home))
    return path.name if path.parent == _launch_home() / "profiles" else None


def _live(session: Any) -> bool:
    return isinstance(session, dict) and not session.get("_finalized")


def _runtime_of(stored_id: str | None) -> str | None:
    """The live runtime id whose agent runs as ``stored_id`` (the ``session_id`` a tool handler and the hooks
    receive is ``agent.session_id``); None when no live session, or more than one, does.

    Only ``agent.session_id`` counts, never ``session_key``: after a compression the gateway keeps the
    rotated-out id as ``session_key`` until the turn ends, and a session resumed on that id meanwhile runs as
    it, so matching the key would hand that session this one's binding."""
    if not stored_id:
        return None
    internals = _internals()
    with internals["_sessions_lock"]:
        items = list(internals["_sessions"].items())
    matches = [
        str(runtime_id)
        for runtime_id, session in items
        if _live(session) and getattr(session.get("agent"), "session_id", None) == stored_id
    ]
    return matches[0] if len(matches) == 1 else None  # ambiguous: nobody gets team tools


def _bound_names(stored_id: str | None) -> set[str]:
    runtime_id = _runtime_of(stored_id)
    with _lock:
        binding = _bindings.get(runtime_id or "")
        if binding is None or binding.expires_at <= _now_ms():
            return set()
        return set(binding.tools)


# --- bind and unbind -------------------------------------------------------------------------------------------


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    def bad(error: str) -> Refused:
        return Refused(400, "invalid_request", error)

    if body.get("native_tools") is not True:
        raise bad("native_tools must be true")
    for key in ("session_id", "stored_session_id", "profile", "generation", "bridge_url", "token"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise bad(f"{key} is required")
    port = BRIDGE.match(body["bridge_url"])
    if port is None or not 0 < int(port.group(1)) < 65536:
        raise bad("bridge_url must be http://127.0.0.1:<port>")
    if len(body["token"]) < 32:
        raise bad("token must have at least 32 characters")
    if not PROFILE.match(body["profile"]):
        raise bad("profile is not a valid profile name")
    expires = body.get("expires_at")
    now = _now_ms()
    if not isinstance(expires, int) or isinstance(expires, bool) or not now < expires <= now + MAX_AHEAD_MS:
        raise bad("expires_at must be in the future and at most 30 minutes ahead")
    return body


def _post(url: str, token: str, body: dict[str, Any], timeout: float) -> Any:
    """POST JSON with the bearer; no proxies, no redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    request = urllib.request.Request(  # noqa: S310 - the URL is checked to be http://127.0.0.1:<port>
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with opener.open(request, timeout=timeout) as response:
        return json.loads(response.read())


def _catalog(binding: Binding, timeout: float) -> list[dict[str, Any]]:
    try:
        answer = _post(f"{binding.bridge_url}/tools/list", binding.token, {}, timeout)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        error = f"the runner's tool listener did not answer ({type(exc).__name__})"
        raise Refused(502, "bridge_unavailable", error) from None
    tools = answer.get("tools") if isinstance(answer, dict) else None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise Refused(502, "bridge_invalid", "the runner's tool list is malformed")
    for tool in tools:
        if not isinstance(tool, dict) or not TEAM_TOOL.match(str(tool.get("id", ""))):
            raise Refused(502, "bridge_invalid", "a tool id is not team_<32 hex>")
    return tools


def _enabled_toolsets(agent: Any, internals: dict[str, Any]) -> list[str]:
    """The agent's enabled toolsets as an explicit list, without any binding's private toolset.

    ``None`` means every registered toolset, and the registry is one per process: expanding it would also
    enable the toolsets other sessions' bindings registered. Those are filtered out (and so is a leftover of
    this session's own), so a session's snapshot only ever gains the one toolset its binding appends."""
    current = getattr(agent, "enabled_toolsets", None)
    names: list[str] = []
    if current is not None:
        names = [str(toolset) for toolset in current]
    else:
        definitions = internals["get_tool_definitions"](quiet_mode=True, skip_tool_search_assembly=True)
        for definition in definitions:
            toolset = internals["registry.get_toolset_for_tool"](definition.get("function", {}).get("name", ""))
            if toolset and toolset not in names:
                names.append(toolset)
    return [toolset for toolset in names if not TEAM_TOOLSET.match(toolset)]


def _handler(tool_id: str) -> Any:
    def handle(args: Any, **kwargs: Any) -> str:
        # only session_id (the agent's stored id) names the caller; task_id may be the gateway's stale key
        return call_tool(tool_id, args, kwargs.get("session_id"))

    return handle


def _register(binding: Binding, session: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    internals = _internals()
    agent = session["agent"]
    registry = internals["registry"]
    for tool in tools:
        schema = {
            "name": tool["id"],
            "description": f"{tool.get('name', '')}: {tool.get('description', '')}"[:4000],
            "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}},
        }
        registry.register(name=tool["id"], toolset=binding.toolset, schema=schema, handler=_handler(tool["id"]))
    original = _enabled_toolsets(agent, internals)
    binding.original_toolsets = original
    internals["refresh_agent_mcp_tools"](agent, enabled_override=[*original, binding.toolset])
    valid = set(getattr(agent, "valid_tool_names", ()) or ())
    binding.tools = [tool["id"] for tool in tools if tool["id"] in valid]


def _release(binding: Binding) -> int:
    """Deregister the binding's tools and restore the agent's toolsets (if the session still lives)."""
    internals = _internals()
    if binding.timer is not None:
        binding.timer.cancel()
    removed = 0
    for name in binding.tools:
        try:
            internals["registry.deregister"](name)
            removed += 1
        except Exception:  # noqa: S112 - best effort: the name may already be gone
            continue
    session = _session(binding.runtime_id)
    agent = session.get("agent") if session is not None else None
    if agent is not None and binding.original_toolsets is not None:
        original = list(binding.original_toolsets)
        with contextlib.suppress(Exception):  # the session is going away: nothing else to restore
            _with_home(binding.profile, lambda: internals["refresh_agent_mcp_tools"](agent, enabled_override=original))
    return removed


def _expire(runtime_id: str, generation: str) -> None:
    unbind({"session_id": runtime_id, "generation": generation})


def _arm(binding: Binding) -> None:
    if binding.timer is not None:
        binding.timer.cancel()
    delay = max(0.0, (binding.expires_at - _now_ms()) / 1000)
    binding.timer = threading.Timer(delay, _expire, (binding.runtime_id, binding.generation))
    binding.timer.daemon = True
    binding.timer.start()


def _reply(binding: Binding) -> dict[str, Any]:
    return {
        "ok": True,
        "native_tools": True,
        "tools": list(binding.tools),
        "stored_session_id": binding.stored_id,
        "expires_at": binding.expires_at,
    }


def bind(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Bind the runner's team tools to one idle live session; ``(status, answer)``."""
    deadline = time.monotonic() + BIND_BUDGET_S
    try:
        fields = _validated(body)
        caps = capabilities(fields["profile"])
        if not caps["ready"]:
            raise Refused(409, "not_ready", f"the plugin is not ready (missing: {caps['missing']})")
        runtime_id = fields["session_id"]
        session = _session(runtime_id)
        if session is None:
            raise Refused(404, "session_not_found", "no live session with this id")
        if _profile_of(session) != fields["profile"]:
            raise Refused(409, "profile_mismatch", "the session belongs to another profile")
        if _stored_of(session) != fields["stored_session_id"]:
            raise Refused(409, "stored_session_mismatch", "the session's stored id differs (compression?)")
        with _lock:
            current = _bindings.get(runtime_id)
            if current is not None and current.generation == fields["generation"]:
                current.expires_at = fields["expires_at"]
                current.stored_id = fields["stored_session_id"]
                _arm(current)
                return 200, _reply(current)
        with session["history_lock"]:
            running = bool(session.get("running"))
        if running:
            raise Refused(409, "session_running", "the session is running a turn; bind before the prompt")
        if session.get("agent") is None:  # build it now (once) so its tool snapshot exists to extend
            _internals()["_start_agent_build"](runtime_id, session)
            ready = session.get("agent_ready")
            if ready is not None:
                ready.wait(max(0.0, deadline - time.monotonic()))
        if session.get("agent_error") or session.get("agent") is None:
            raise Refused(409, "agent_failed", "the session's agent could not be built")
        binding = Binding(
            runtime_id=runtime_id,
            stored_id=fields["stored_session_id"],
            profile=fields["profile"],
            generation=fields["generation"],
            bridge_url=fields["bridge_url"],
            token=fields["token"],
            expires_at=fields["expires_at"],
            toolset=f"teamrt_{uuid.uuid4().hex[:16]}",
        )
        tools = _catalog(binding, max(1.0, deadline - time.monotonic()))  # outside the lock: a network call
        with _lock:
            older = _bindings.pop(runtime_id, None)
            if older is not None:  # an older generation on this session is unbound first
                _release(older)
            try:
                _with_home(binding.profile, lambda: _register(binding, session, tools))
            except Exception as exc:
                _release(binding)
                raise Refused(500, "bind_failed", f"registering the tools failed ({type(exc).__name__})") from None
            _bindings[runtime_id] = binding
            _arm(binding)
            return 200, _reply(binding)
    except Refused as refused:
        return refused.status, {"ok": False, "error": refused.error, "code": refused.code}


def unbind(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Remove the binding of ``session_id`` if it has ``generation``; idempotent."""
    runtime_id, generation = body.get("session_id"), body.get("generation")
    if not isinstance(runtime_id, str) or not isinstance(generation, str):
        return 400, {"ok": False, "error": "session_id and generation are required", "code": "invalid_request"}
    with _lock:
        binding = _bindings.get(runtime_id)
        if binding is None or binding.generation != generation:
            return 200, {"ok": True, "removed": 0}
        del _bindings[runtime_id]
        return 200, {"ok": True, "removed": _release(binding)}


# --- calls and guards ------------------------------------------------------------------------------------------


def _error(code: str, error: str) -> str:
    return json.dumps({"error": error, "code": code})


def call_tool(tool_id: str, args: Any, stored_id: str | None) -> str:
    """The registered handler: check the calling session's live binding, then forward to the runner."""
    runtime_id = _runtime_of(stored_id)
    with _lock:
        binding = _bindings.get(runtime_id or "")
        if binding is None or tool_id not in binding.tools:
            return _error("not_bound", "this team tool is not bound to this session")
        if binding.expires_at <= _now_ms():
            return _error("expired", "this team tool's grant has expired")
        bridge, token = binding.bridge_url, binding.token
    session = _session(runtime_id or "")
    if session is None or not session.get("running"):
        return _error("not_running", "team tools run only during a turn")
    body = {"toolId": tool_id, "arguments": args if isinstance(args, dict) else {}, "callId": str(uuid.uuid4())}
    for attempt in range(2):  # one retry with the same callId: the runner deduplicates it
        try:
            answer = _post(f"{bridge}/tools/call", token, body, CALL_TIMEOUT_S)
            break
        except (OSError, urllib.error.URLError, ValueError) as exc:
            if attempt == 1:
                return _error("bridge_unavailable", f"the runner did not answer ({type(exc).__name__})")
    content = answer.get("content") if isinstance(answer, dict) else None
    if not isinstance(content, list):
        return _error("bridge_invalid", "the runner's answer is malformed")
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def pre_tool_call(tool_name: str = "", session_id: str | None = None, **_: Any) -> dict[str, Any] | None:
    """Block any ``team_*`` tool not bound to the calling session."""
    if TEAM_TOOL.match(tool_name or "") and tool_name not in _bound_names(session_id):
        return {"action": "block", "message": f"Tool '{tool_name}' is not available in this session."}
    return None


def llm_request(request: Any = None, session_id: str | None = None, **_: Any) -> dict[str, Any] | None:
    """Remove from the model request every ``team_*`` tool not bound to this session."""
    if not isinstance(request, dict) or not isinstance(request.get("tools"), list):
        return None
    bound = _bound_names(session_id)
    kept = [
        tool
        for tool in request["tools"]
        if not TEAM_TOOL.match(str((tool.get("function") or {}).get("name", "")) if isinstance(tool, dict) else "")
        or tool["function"]["name"] in bound
    ]
    if len(kept) == len(request["tools"]):
        return None
    return {"request": {**request, "tools": kept}, "reason": "talaria: team tools of other sessions removed"}


def on_session_finalize(session_id: str | None = None, **_: Any) -> None:
    """A session really closed: drop the bindings of sessions no longer live.

    Hermes fires this after it marked the session finalized and removed it from ``_sessions``. The stored id it
    passes does not say whose binding it is: a binding's stored id is stale after a compression, and a session
    resumed on the rotated-out id finalizes under it while the bound session lives on."""
    with _lock:
        gone = [b for b in _bindings.values() if not _live(_session(b.runtime_id))]
        for binding in gone:
            del _bindings[binding.runtime_id]
            _release(binding)
