"""Rendering pages: the Jinja2 environment (autoescaped, strict), time filters, and the headers every page
carries (a strict Content-Security-Policy: no inline script or style, so every script is ``/static/app.js``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import jinja2
from starlette.responses import HTMLResponse

from talaria.lifecycle.machine import TASK_FINAL, TERMINAL

HERE: Final = Path(__file__).parent
STATIC_DIR: Final = HERE / "static"

PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(ms: int | None) -> str:
    """A time in milliseconds as ``2026-11-30 04:31:16 UTC`` (or an em dash)."""
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def span(seconds: float) -> str:
    """A duration in words: ``42 s``, ``3 min``, ``2 h 5 min``, ``4 d 3 h``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


class Pages:
    """The templates, rendered with the hub's clock for relative times."""

    def __init__(self, now_ms: Any) -> None:
        self.now_ms = now_ms
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["when"] = when
        self.env.filters["ago"] = self.ago
        self.env.filters["since"] = self.since
        self.env.filters["clock"] = self.clock
        self.env.globals["JOB_FINAL"] = TERMINAL
        self.env.globals["TASK_FINAL"] = TASK_FINAL

    def ago(self, ms: int | None) -> str:
        return "never" if ms is None else f"{span((self.now_ms() - ms) / 1000)} ago"

    def clock(self, ms: int) -> str:
        """A message's time, ``04:31 UTC``, with its date in front when it is not today's (in UTC)."""
        at = datetime.fromtimestamp(ms / 1000, tz=UTC)
        today = datetime.fromtimestamp(self.now_ms() / 1000, tz=UTC).date()
        return at.strftime("%H:%M UTC" if at.date() == today else "%Y-%m-%d %H:%M UTC")

    def since(self, ms: int | None) -> str:
        return "—" if ms is None else span((self.now_ms() - ms) / 1000)

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=status, headers=PAGE_HEADERS)
