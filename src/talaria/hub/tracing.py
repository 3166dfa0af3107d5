"""The ids of the work a hub task does (operations.md 5.3, 5.5): bound once where the work starts, they are on every
log line it writes (structlog's context variables, which ``asyncio`` tasks and ``asyncio.to_thread`` inherit) and its
runner commands carry the trace as a W3C ``traceparent`` (protocol note ``trace-v1``; the runner only logs it, Hermes
receives nothing).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import structlog

TRACE_FEATURE: Final = "trace-v1"
_trace: ContextVar[str | None] = ContextVar("talaria_trace", default=None)


@contextmanager
def work(trace: str | None, **ids: Any) -> Iterator[None]:
    """Bind ``trace`` and the other ids (``job_id``, ``task_id``, ``tenant``, ``runner_id``, ...) for the code inside,
    and the tasks it starts."""
    token = _trace.set(trace)
    try:
        with structlog.contextvars.bound_contextvars(trace=trace, **ids):
            yield
    finally:
        _trace.reset(token)


def traceparent() -> str | None:
    """A ``traceparent`` for a command sent for the current work (a new parent id each time), or None."""
    trace = _trace.get()
    return f"00-{trace}-{secrets.token_hex(8)}-01" if trace else None
