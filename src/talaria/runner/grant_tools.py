"""The tools of one grant as its loopback listener serves them (runner-protocol.md 12.3).

``POST /tools/list`` lists the grant's catalog under opaque ids; ``POST /tools/call`` validates the call,
deduplicates it per ``callId``, enforces the 128-call limit and forwards it with the real tool id. Every call
answer is an MCP-shaped result with HTTP 200, errors included: the listener's only HTTP errors are its
pre-checks (``grant_listener.py``) and a ``/tools/list`` body that is not a JSON object.

Decisions where the specification is silent:

- A malformed ``/tools/call`` body (not JSON, wrong keys or types, ``arguments`` nested deeper than 30 levels,
  ``callId`` outside 1-200 characters) is an isError result with code ``invalid_request``; it is not recorded.
- An unknown tool id is recorded like any call: it counts towards the 128 and repeats its ``not_found``.
- A failure that leaves the outcome unknown (no answer from the hub, or a hub 5xx) is answered but forgotten,
  so the plugin's retry with the same ``callId`` is forwarded again; the hub's own dedupe keeps that safe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from talaria.canonical import canonical_json, sha256_hex

MAX_CALLS_PER_GRANT: Final = 128  # a 129th distinct callId -> isError runner_call_limit
MAX_ARGUMENT_DEPTH: Final = 30  # `arguments` nested deeper -> isError invalid_request
MAX_CALL_ID_CHARS: Final = 200  # a longer (or empty) callId -> isError invalid_request
MAX_ERROR_MESSAGE_CHARS: Final = 1000  # longer messages are cut
CALL_KEYS: Final = frozenset({"toolId", "arguments", "callId"})
CATALOG_KEYS: Final = frozenset({"id", "name", "description", "inputSchema"})

Forward = Callable[[str, str, dict[str, Any]], Awaitable[Any]]  # (real tool id, callId, arguments) -> result


class ToolError(Exception):
    """A failed call. ``final`` False: the outcome is unknown, so the call is not remembered."""

    def __init__(self, code: str, message: str, *, final: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:MAX_ERROR_MESSAGE_CHARS]
        self.final = final


def opaque_tool_id(bearer: str, real_id: str) -> str:
    """``team_`` + the first 32 hex characters of sha256(``<grant bearer>:<real tool id>``)."""
    return "team_" + hashlib.sha256(f"{bearer}:{real_id}".encode()).hexdigest()[:32]


def success(result: Any) -> dict[str, Any]:
    """The text is compact JSON with the keys in the order the hub sent them (team tools put ids and states first,
    team-tools.md 6.1; ADR 0038), so the model reads the hub's own bytes."""
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return {"content": [{"type": "text", "text": text}], "structuredContent": result}


def failure(code: str, message: str) -> dict[str, Any]:
    text = canonical_json({"error": message[:MAX_ERROR_MESSAGE_CHARS], "code": code}).decode("utf-8")
    return {"content": [{"type": "text", "text": text}], "isError": True}


def depth(value: Any) -> int:
    """Nesting depth of containers: a scalar is 0, ``{}`` is 1, ``{"a": []}`` is 2. Iterative."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """Strict UTF-8 JSON (no NaN or Infinity); ValueError otherwise, including absurd nesting."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


@dataclass
class CatalogTool:
    real_id: str
    entry: dict[str, Any]  # {id: <opaque>, name, description, inputSchema}


def check_catalog(catalog: Any) -> list[dict[str, Any]]:
    """The hub's catalog (7.5): a list of strict ``{id, name, description, inputSchema}`` with unique ids."""
    if not isinstance(catalog, list):
        raise ValueError("catalog must be a list")
    seen: set[str] = set()
    for tool in catalog:
        if not isinstance(tool, dict) or set(tool) != CATALOG_KEYS:
            raise ValueError("a catalog entry must be exactly {id, name, description, inputSchema}")
        real = tool["id"]
        if not isinstance(real, str) or not 1 <= len(real) <= 100 or real in seen:
            raise ValueError("catalog ids must be unique strings of 1-100 characters")
        if not isinstance(tool["name"], str) or not isinstance(tool["description"], str):
            raise ValueError("catalog names and descriptions must be strings")
        if not isinstance(tool["inputSchema"], dict):
            raise ValueError("a catalog inputSchema must be an object")
        seen.add(real)
    return catalog


@dataclass
class _Call:
    fingerprint: str
    outcome: asyncio.Future[dict[str, Any]]
    task: asyncio.Task[None] | None = None


@dataclass
class ToolCalls:
    """The calls of one grant. ``close()`` answers every waiting call ``runner_grant_expired``; idempotent."""

    bearer: str = field(repr=False)
    catalog: list[dict[str, Any]]
    forward: Forward
    closed: bool = False
    _tools: dict[str, CatalogTool] = field(default_factory=dict, init=False, repr=False)
    _calls: dict[str, _Call] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for tool in self.catalog:
            opaque = opaque_tool_id(self.bearer, tool["id"])
            if opaque in self._tools:  # a sha256 prefix collision; refuse rather than mix tools up
                raise ValueError("two catalog ids map to one opaque id")
            entry = {"id": opaque, "name": tool["name"], "description": tool["description"]}
            self._tools[opaque] = CatalogTool(tool["id"], entry | {"inputSchema": tool["inputSchema"]})

    @property
    def call_count(self) -> int:
        return len(self._calls)

    def listing(self) -> dict[str, Any]:
        return {"tools": [tool.entry for tool in self._tools.values()], "warnings": []}

    async def serve(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """Answer one request that passed the listener's pre-checks: (HTTP status, JSON body)."""
        if path == "/tools/list":
            try:
                parsed = parse_json(body)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                return 400, {"error": "the body must be a JSON object", "code": "invalid_json"}
            return 200, self.listing()
        if path == "/tools/call":
            return 200, await self.call(body)
        return 404, {"error": "no such route", "code": "not_found"}

    async def call(self, body: bytes) -> dict[str, Any]:
        if self.closed:
            return failure("runner_grant_expired", "the grant is closed")
        try:
            tool_id, arguments, call_id, fingerprint = _check_call(body)
        except ValueError as exc:
            return failure("invalid_request", str(exc))
        known = self._calls.get(call_id)
        if known is not None:
            if known.fingerprint != fingerprint:
                return failure("idempotency_conflict", "this callId was used with another tool or other arguments")
            return await asyncio.shield(known.outcome)
        if len(self._calls) >= MAX_CALLS_PER_GRANT:
            return failure("runner_call_limit", f"this grant has used its {MAX_CALLS_PER_GRANT} tool calls")
        call = _Call(fingerprint, asyncio.get_running_loop().create_future())
        self._calls[call_id] = call
        tool = self._tools.get(tool_id)
        if tool is None:
            call.outcome.set_result(failure("not_found", "no such tool in this grant"))
        else:
            call.task = asyncio.get_running_loop().create_task(self._run(call, call_id, tool.real_id, arguments))
        return await asyncio.shield(call.outcome)

    async def _run(self, call: _Call, call_id: str, real_id: str, arguments: dict[str, Any]) -> None:
        try:
            answer = success(await self.forward(real_id, call_id, arguments))
        except ToolError as exc:
            if not exc.final and self._calls.get(call_id) is call:
                del self._calls[call_id]
            answer = failure(exc.code, exc.message)
        except asyncio.CancelledError:
            answer = failure("runner_grant_expired", "the grant closed during the call")
        except Exception as exc:  # a bug must still answer every waiting duplicate
            answer = failure("runner_internal_error", f"the runner failed: {type(exc).__name__}")
        if not call.outcome.done():
            call.outcome.set_result(answer)

    def close(self) -> None:
        """Fail every waiting call with ``runner_grant_expired`` and stop forwarding."""
        self.closed = True
        expired = failure("runner_grant_expired", "the grant closed during the call")
        for call in self._calls.values():
            if not call.outcome.done():
                call.outcome.set_result(expired)
            if call.task is not None and not call.task.done():
                call.task.cancel()


def _check_call(body: bytes) -> tuple[str, dict[str, Any], str, str]:
    """(toolId, arguments, callId, fingerprint) of a valid ``/tools/call`` body, else ValueError."""
    parsed = parse_json(body)
    if not isinstance(parsed, dict) or set(parsed) != CALL_KEYS:
        raise ValueError("the body must be exactly {toolId, arguments, callId}")
    tool_id, arguments, call_id = parsed["toolId"], parsed["arguments"], parsed["callId"]
    if not isinstance(tool_id, str):
        raise ValueError("toolId must be a string")
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be an object")
    if depth(arguments) > MAX_ARGUMENT_DEPTH:
        raise ValueError(f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CALL_ID_CHARS:
        raise ValueError(f"callId must be a string of 1-{MAX_CALL_ID_CHARS} characters")
    try:
        fingerprint = sha256_hex(canonical_json([tool_id, arguments]))
    except ValueError:  # a lone surrogate cannot be encoded as UTF-8
        raise ValueError("the call is not valid UTF-8 JSON") from None
    return tool_id, arguments, call_id, fingerprint
