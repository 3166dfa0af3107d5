"""Chat through the JSON API and its live stream, for the real-Hermes chat tests."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def make_bot(
    client: httpx.Client, name: str = "Helper", profile: str = "default", instructions: str = "", source: str = "local"
) -> str:
    answer = client.post("/api/bots", json={"name": name, "source": source, "profile": profile,
                                            "instructions": instructions})  # fmt: skip
    assert answer.status_code == 201, answer.text
    bot_id: str = answer.json()["bot"]["id"]
    return bot_id


def start_chat(client: httpx.Client, bot_id: str) -> str:
    answer = client.post("/api/conversations", json={"botId": bot_id})
    assert answer.status_code == 201, answer.text
    conversation_id: str = answer.json()["conversation"]["id"]
    return conversation_id


def send(client: httpx.Client, conversation_id: str, text: str, **headers: str) -> httpx.Response:
    return client.post(f"/api/conversations/{conversation_id}/turns", json={"text": text}, headers=headers)


def turn_of(client: httpx.Client, conversation_id: str, turn_id: str) -> dict[str, Any]:
    turn: dict[str, Any] = client.get(f"/api/conversations/{conversation_id}/turns/{turn_id}").json()["turn"]
    return turn


def wait_turn(client: httpx.Client, conversation_id: str, turn_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        turn = turn_of(client, conversation_id, turn_id)
        if turn["state"] in ("completed", "failed", "interrupted", "uncertain"):
            return turn
        assert time.monotonic() < deadline, turn
        time.sleep(0.05)


def messages(client: httpx.Client, conversation_id: str) -> list[dict[str, Any]]:
    page: list[dict[str, Any]] = client.get(f"/api/conversations/{conversation_id}/messages").json()["messages"]
    return list(reversed(page))


class Stream:
    """A conversation's live stream read on a thread: ``events`` in arrival order, ``(id, type, data)``."""

    def __init__(
        self, client: httpx.Client, conversation_id: str, after: int | None = None, last_event_id: int | None = None
    ) -> None:
        self.events: list[tuple[int | None, str, dict[str, Any]]] = []
        self._cond = threading.Condition()
        # its own connection, closed when the stream ends (a killed hub must not leave a socket behind)
        self._client = httpx.Client(base_url=client.base_url, headers=client.headers, cookies=client.cookies)
        params = {} if after is None else {"after": str(after)}
        self._url = f"/api/conversations/{conversation_id}/events"
        self._params = params
        self._headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        self._stop = False
        self.status: int | None = None
        self.ended = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        # connected before the caller goes on: a stream that follows "now" must not miss what is sent next
        self.wait_for(lambda _: self.status is not None or self.ended, timeout=30)

    def _read(self) -> None:
        try:
            self._follow()
        except httpx.HTTPError:  # the hub stopped or went away
            pass
        finally:
            self._client.close()
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def _follow(self) -> None:
        with self._client.stream(
            "GET", self._url, params=self._params, headers=self._headers, timeout=httpx.Timeout(5, read=120)
        ) as r:
            with self._cond:
                self.status = r.status_code
                self._cond.notify_all()
            event_id: int | None = None
            kind = ""
            for line in r.iter_lines():
                if self._stop:
                    return
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    with self._cond:
                        self.events.append((event_id, kind, json.loads(line[6:])))
                        self._cond.notify_all()
                    event_id, kind = None, ""

    def wait_for(self, predicate: Callable[[list[tuple[int | None, str, dict[str, Any]]]], bool],
                 timeout: float = 90) -> list[tuple[int | None, str, dict[str, Any]]]:  # fmt: skip
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                left = deadline - time.monotonic()
                assert left > 0, [e[1] for e in self.events]
                self._cond.wait(left)
            return list(self.events)

    def of_turn(self, turn_id: str) -> list[tuple[int | None, str, dict[str, Any]]]:
        with self._cond:
            return [e for e in self.events if e[2].get("turnId") == turn_id
                    or (e[2].get("turn") or {}).get("id") == turn_id]  # fmt: skip

    def close(self) -> None:
        """Stop reading: the stream's thread ends at its next line, keepalive or end and closes its client."""
        self._stop = True


def audit_verifies(data_dir: Path) -> bool:
    """``talaria audit verify`` on the hub's data directory (the hub may be serving)."""
    done = subprocess.run([sys.executable, "-m", "talaria", "audit", "verify", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return done.returncode == 0


def audit_dump(data_dir: Path) -> str:
    """Every audit row of the hub's database as text (to scan for message text, which must never be there)."""
    conn = sqlite3.connect(data_dir / "talaria.sqlite3")
    try:
        return "\n".join(str(row) for row in conn.execute("SELECT * FROM audit_event"))
    finally:
        conn.close()


def assert_text_kept_out(texts: list[str], data_dir: Path, *logs: str) -> None:
    """Chat.md 2, 8: message text never enters the audit table or the logs."""
    dump = audit_dump(data_dir)
    for text in texts:
        assert text not in dump, "message text in the audit table"
        for log in logs:
            assert text not in log, "message text in a log"


def ended(turn_id: str) -> Callable[[list[tuple[int | None, str, dict[str, Any]]]], bool]:
    kinds = ("turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain")
    return lambda events: any(k in kinds and d["turn"]["id"] == turn_id for _, k, d in events)
