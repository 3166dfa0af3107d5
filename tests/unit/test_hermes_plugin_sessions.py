"""The Hermes plugin's session lookup and toolset expansion (hermes.md 8, defect 7), in process: ``runtime.py``
is loaded on its own with fake ``tui_gateway.server._sessions`` and a fake tool registry, no Hermes needed.

The situation is the one a compression leaves: A's agent runs as K2 while the gateway still keys A on the
rotated-out K1 (until A's turn ends), and B, resumed on K1 meanwhile, runs as K1."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import talaria.hermes_plugin

RUNTIME = Path(talaria.hermes_plugin.__file__).resolve().parent / "files" / "runtime.py"
TOOL_A, TOOL_B = "team_" + "a" * 32, "team_" + "b" * 32
TOOLSET_A, TOOLSET_B = "teamrt_" + "a" * 16, "teamrt_" + "b" * 16


class FakeRegistry:
    def __init__(self) -> None:
        self.toolsets = {"terminal": "terminal", TOOL_A: TOOLSET_A, TOOL_B: TOOLSET_B}
        self.deregistered: list[str] = []

    def deregister(self, name: str) -> None:
        self.deregistered.append(name)

    def get_toolset_for_tool(self, name: str) -> str | None:
        return self.toolsets.get(name)


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The fake ``_sessions``: A compressed mid-turn (key K1, agent K2), B resumed on K1 (key and agent K1)."""
    live: dict[str, Any] = {
        "aaaa1111": {"session_key": "K1", "agent": SimpleNamespace(session_id="K2"), "running": True},
        "bbbb2222": {"session_key": "K1", "agent": SimpleNamespace(session_id="K1"), "running": True},
    }
    server = ModuleType("tui_gateway.server")
    server._sessions = live  # type: ignore[attr-defined]
    server._sessions_lock = threading.Lock()  # type: ignore[attr-defined]
    registry_module = ModuleType("tools.registry")
    registry_module.registry = FakeRegistry()  # type: ignore[attr-defined]
    for name, module in (("tui_gateway", ModuleType("tui_gateway")), ("tui_gateway.server", server),
                         ("tools", ModuleType("tools")), ("tools.registry", registry_module)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    return live


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, sessions: dict[str, Any]) -> Any:
    """A fresh copy of the plugin's ``runtime.py`` (its own binding table), with A and B bound."""
    name = f"talaria_hermes_runtime_test_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, RUNTIME)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    expires = module._now_ms() + 600_000
    for runtime_id, stored, tool, toolset in (("aaaa1111", "K1", TOOL_A, TOOLSET_A),  # A bound before compressing
                                              ("bbbb2222", "K1", TOOL_B, TOOLSET_B)):  # fmt: skip
        module._bindings[runtime_id] = module.Binding(
            runtime_id=runtime_id, stored_id=stored, profile="default", generation=f"{runtime_id}:g",
            bridge_url="http://127.0.0.1:9", token="t" * 43, expires_at=expires, toolset=toolset, tools=[tool],
        )  # fmt: skip
    return module


def schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "", "parameters": {}}}


def test_a_session_is_found_by_its_agents_stored_id_never_by_a_stale_gateway_key(
    runtime: Any, sessions: dict[str, Any]
) -> None:
    assert runtime._runtime_of("K1") == "bbbb2222"
    assert runtime._runtime_of("K2") == "aaaa1111"
    sessions["cccc3333"] = {"session_key": "K3", "agent": None}  # not built yet: nothing runs as K3
    assert runtime._runtime_of("K3") is None
    sessions["dddd4444"] = {"session_key": "K4", "agent": SimpleNamespace(session_id="K2")}
    assert runtime._runtime_of("K2") is None  # two live agents run as K2: neither is trusted


def test_the_guards_give_the_session_resumed_on_the_old_id_only_its_own_tool(runtime: Any) -> None:
    block = runtime.pre_tool_call(tool_name=TOOL_A, session_id="K1")
    assert block is not None and block["action"] == "block"
    assert runtime.pre_tool_call(tool_name=TOOL_B, session_id="K1") is None
    assert runtime.pre_tool_call(tool_name=TOOL_A, session_id="K2") is None
    request = {"model": "m", "tools": [schema(TOOL_A), schema(TOOL_B), schema("terminal")]}
    kept = runtime.llm_request(request=request, session_id="K1")["request"]["tools"]
    assert [tool["function"]["name"] for tool in kept] == [TOOL_B, "terminal"]
    refusal = json.loads(runtime.call_tool(TOOL_A, {}, "K1"))
    assert refusal["code"] == "not_bound"  # refused before any call to A's bridge


def test_the_handler_names_the_caller_by_session_id_only(runtime: Any) -> None:
    handler = runtime._handler(TOOL_A)
    refusal = json.loads(handler({}, task_id="K2", session_id=""))
    assert refusal["code"] == "not_bound"


def test_expanding_every_toolset_leaves_out_the_bindings_private_toolsets(runtime: Any) -> None:
    registry = sys.modules["tools.registry"].registry
    internals = {
        "get_tool_definitions": lambda **_: [schema("terminal"), schema(TOOL_A), schema(TOOL_B)],
        "registry.get_toolset_for_tool": registry.get_toolset_for_tool,
    }
    assert runtime._enabled_toolsets(SimpleNamespace(enabled_toolsets=None), internals) == ["terminal"]
    explicit = SimpleNamespace(enabled_toolsets=["terminal", "web", TOOLSET_A])
    assert runtime._enabled_toolsets(explicit, internals) == ["terminal", "web"]


def test_finalizing_the_session_resumed_on_the_old_id_keeps_the_other_binding(
    runtime: Any, sessions: dict[str, Any]
) -> None:
    closed = sessions.pop("bbbb2222")  # Hermes pops the session, marks it finalized, then fires the hook
    closed["_finalized"] = True
    runtime.on_session_finalize(session_id="K1")
    assert list(runtime._bindings) == ["aaaa1111"]
    assert sys.modules["tools.registry"].registry.deregistered == [TOOL_B]
