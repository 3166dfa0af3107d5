"""Talaria's Hermes plugin, routes (mounted at ``/api/plugins/talaria/`` behind Hermes' own credential):
``GET /capabilities?profile=``, ``POST /bind``, ``POST /unbind``. The work is in ``runtime.py``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

RUNTIME_MODULE = "talaria_hermes_runtime"
MAX_BODY_BYTES = 64 * 1024


def _runtime() -> ModuleType:
    module = sys.modules.get(RUNTIME_MODULE)
    if module is None:
        path = Path(__file__).resolve().parent.parent / "runtime.py"
        spec = importlib.util.spec_from_file_location(RUNTIME_MODULE, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[RUNTIME_MODULE] = module
        spec.loader.exec_module(module)
    return module


router = APIRouter()


async def _body(request: Request) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return JSONResponse({"ok": False, "error": "the body is too large", "code": "invalid_request"}, status_code=413)
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"ok": False, "error": "the body is not a JSON object", "code": "invalid_request"},
                            status_code=400)  # fmt: skip
    return body


@router.get("/capabilities")
async def capabilities(profile: str = "default") -> JSONResponse:
    runtime = _runtime()
    return JSONResponse(await run_in_threadpool(runtime.capabilities, profile))


@router.post("/bind")
async def bind(request: Request) -> JSONResponse:
    runtime = _runtime()
    body = await _body(request)
    if isinstance(body, JSONResponse):
        return body
    status, answer = await run_in_threadpool(runtime.bind, body)
    return JSONResponse(answer, status_code=status)


@router.post("/unbind")
async def unbind(request: Request) -> JSONResponse:
    runtime = _runtime()
    body = await _body(request)
    if isinstance(body, JSONResponse):
        return body
    status, answer = await run_in_threadpool(runtime.unbind, body)
    return JSONResponse(answer, status_code=status)
