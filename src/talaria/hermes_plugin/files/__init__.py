"""Talaria's Hermes plugin, agent part: registers the guards (a ``pre_tool_call`` hook, an ``llm_request``
middleware) and the finalize hook, and no tools. Team tools are bound per session through the routes in
``dashboard/plugin_api.py``; both parts share ``runtime.py`` under one fixed module name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

RUNTIME_MODULE = "talaria_hermes_runtime"


def _runtime() -> ModuleType:
    module = sys.modules.get(RUNTIME_MODULE)
    if module is None:
        spec = importlib.util.spec_from_file_location(RUNTIME_MODULE, Path(__file__).resolve().parent / "runtime.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[RUNTIME_MODULE] = module
        spec.loader.exec_module(module)
    return module


def register(ctx: Any) -> None:
    runtime = _runtime()
    ctx.register_hook("pre_tool_call", runtime.pre_tool_call)
    ctx.register_hook("on_session_finalize", runtime.on_session_finalize)
    ctx.register_middleware("llm_request", runtime.llm_request)
    runtime.STATE["hooks_loaded"] = True
