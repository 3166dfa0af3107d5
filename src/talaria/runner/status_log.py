"""The runner's status lines on standard error (operations.md 5.3): ``--log-format text`` (the default) writes v1's
lines as they are; ``json`` writes each as one object with ``timestamp``, ``level``, ``event``, ``message``,
``runner_id``, ``instance`` and ``epoch``, and adds ``command_started``/``command_finished`` lines (``command_id``,
``kind``, ``outcome``, ``ms``, ``trace``). Never a token, a body or a Hermes credential.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

FORMATS: Final = ("text", "json")
_WARNING_WORDS: Final = ("disconnected", "failed", "timed out", "refused")


def _event_of(line: str) -> str:
    """``runner connected`` → ``runner_connected``; ``runner: <code>: advice`` → ``<code>``."""
    head, _, rest = line.partition(":")
    if head.strip() in ("runner", "talaria runner") and rest:
        head = rest.strip().partition(":")[0]
    return "_".join(head.split()) or "runner"


def _level_of(line: str) -> str:
    if line.startswith(("runner:", "talaria runner:")):
        return "error"
    return "warning" if any(word in line for word in _WARNING_WORDS) else "info"


class StatusLog:
    def __init__(
        self, fmt: str = "text", *, out: TextIO | None = None, runner_id: str | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        if fmt not in FORMATS:
            raise ValueError(f"unknown log format {fmt!r}")
        self.json = fmt == "json"
        self.out = out if out is not None else sys.stderr
        self.runner_id = runner_id
        self.instance: str | None = None
        self.epoch: str | None = None
        self._wall = wall

    def say(self, line: str, *, event: str | None = None) -> None:
        """One status line (text), or its object (json)."""
        if not self.json:
            print(line, file=self.out, flush=True)
            return
        self._write(event or _event_of(line), _level_of(line), {"message": line})

    def command(self, event: str, **fields: Any) -> None:
        """``command_started``/``command_finished`` (json only: the text format keeps v1's lines)."""
        if self.json:
            self._write(event, "info", fields)

    def _write(self, event: str, level: str, fields: dict[str, Any]) -> None:
        stamp = datetime.fromtimestamp(self._wall(), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        record = {"timestamp": stamp, "level": level, "event": event, **fields, "runner_id": self.runner_id,
                  "instance": self.instance, "epoch": self.epoch}  # fmt: skip
        print(json.dumps(record, separators=(",", ":")), file=self.out, flush=True)
