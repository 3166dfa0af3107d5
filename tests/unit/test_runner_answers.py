"""The runner answers every command it began (runner-protocol.md 9; ADR 0019): a reply canonical JSON cannot
carry becomes ``runner_reply_unrepresentable``, stored so that a redelivery replays it; a receipt that cannot be
written is reported to the runner (which stops) and the reply is still posted.

The executor runs against a real receipts file and a ``HubClient`` over a scripted wire (the hub faked at its
transport, convention 9). Tests wait on the wire's event, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.runner.errors import CommandError
from talaria.runner.executor import Executor
from talaria.runner.hub_client import HubClient, HubError, Identity
from talaria.runner.receipts import UNCERTAIN_MESSAGE, Receipts, ReceiptsError
from talaria.wire import WireReply

UNREPRESENTABLE = "runner_reply_unrepresentable"
EPOCH = "epoch-1"


class ScriptedHub:
    """The hub's side of the wire: ``admit`` allows, ``result`` is recorded and signalled."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.posted = asyncio.Event()

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        op = target.rsplit("/", 1)[-1]
        if op == "admit":
            return WireReply(200, {}, b'{"allowed": true}')
        if op == "result":
            self.results.append(json.loads(body or b"null"))
            self.posted.set()
        return WireReply(200, {}, b'{"ok": true}')

    async def aclose(self) -> None:
        return None

    async def next_result(self, timeout: float = 5.0) -> dict[str, Any]:
        await asyncio.wait_for(self.posted.wait(), timeout)
        self.posted.clear()
        return self.results[-1]


def command(clock: ManualClock, kind: str = "gateway.rpc") -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "kind": kind, "payload": {}, "expiresAt": clock.now_ms() + 30_000}


def stored_row(path: Path, command_id: str) -> tuple[str, Any]:
    conn = sqlite3.connect(path)
    try:
        state, result = conn.execute("SELECT state, result FROM commands WHERE id = ?", (command_id,)).fetchone()
    finally:
        conn.close()
    return state, None if result is None else json.loads(result)


def executor(
    receipts: Receipts, clock: ManualClock, hub: ScriptedHub, answer: Any, failures: list[ReceiptsError]
) -> tuple[Executor, list[int]]:
    calls: list[int] = []

    async def handler(_: dict[str, Any]) -> Any:
        calls.append(1)
        return answer

    async def on_hub_error(_: HubError) -> None:
        return None

    client = HubClient("http://127.0.0.1:1", Identity(str(uuid.uuid4()), "t" * 32, str(uuid.uuid4())), wire=hub)
    made = Executor(
        client,
        receipts,
        clock,
        handlers={"gateway.rpc": handler},
        epoch_is_current=lambda epoch: epoch == EPOCH,
        on_hub_error=on_hub_error,
        on_receipts_failure=failures.append,
    )
    return made, calls


@pytest.mark.parametrize(
    "answer",
    [
        {"usage": {"cost": float("nan")}},
        {"usage": {"cost": float("inf")}},
        [float("-inf")],
        {"title": "half a pair \ud800"},
        {"\udfff": 1},
    ],
    ids=["nan", "infinity", "minus-infinity", "lone-surrogate", "surrogate-key"],
)
def test_a_reply_canonical_json_refuses_is_answered_as_runner_reply_unrepresentable_and_replayed(
    tmp_path: Path, clock: ManualClock, answer: Any
) -> None:
    path = tmp_path / "runner-commands.sqlite3"

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[int], list[ReceiptsError]]:
        hub, failures = ScriptedHub(), list[ReceiptsError]()
        with Receipts(path, clock) as receipts:
            run, calls = executor(receipts, clock, hub, answer, failures)
            cmd = command(clock)
            run.submit(cmd, EPOCH)
            first = await hub.next_result()
            run.submit(cmd, EPOCH)  # a redelivery: the stored error is posted again, nothing runs twice
            second = await hub.next_result()
            return cmd, first, second, calls, failures

    cmd, first, second, calls, failures = asyncio.run(go())
    assert set(first) == {"id", "error"}, first
    assert first["id"] == cmd["id"]
    assert first["error"]["code"] == UNREPRESENTABLE
    assert "JSON" in first["error"]["message"]
    assert second == first
    assert calls == [1]
    assert failures == []
    assert stored_row(path, cmd["id"]) == ("complete", {"error": first["error"]})


def test_a_receipt_that_cannot_be_written_is_reported_and_the_reply_still_posted(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "runner-commands.sqlite3"
    large = {"body": "x" * 65536}  # needs new pages: the file may not grow (a full disk, for SQLite)

    async def go() -> tuple[dict[str, Any], dict[str, Any], list[ReceiptsError]]:
        hub, failures = ScriptedHub(), list[ReceiptsError]()
        with Receipts(path, clock) as receipts:
            pages = receipts._conn.execute("PRAGMA page_count").fetchone()[0]
            receipts._conn.execute(f"PRAGMA max_page_count = {pages}")
            run, _ = executor(receipts, clock, hub, large, failures)
            cmd = command(clock)
            run.submit(cmd, EPOCH)
            return cmd, await hub.next_result(), failures

    cmd, posted, failures = asyncio.run(go())
    assert posted == {"id": cmd["id"], "result": large}, "the hub still learns the outcome"
    assert len(failures) == 1
    assert "full" in str(failures[0])
    assert stored_row(path, cmd["id"]) == ("started", None), "uncertain after a restart, never replayed"


def test_a_started_receipt_that_cannot_be_written_is_reported_and_answered_uncertain(
    tmp_path: Path, clock: ManualClock
) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any], list[int], list[ReceiptsError]]:
        hub, failures = ScriptedHub(), list[ReceiptsError]()
        receipts = Receipts(tmp_path / "runner-commands.sqlite3", clock)
        receipts.close()  # every later use of the file fails
        run, calls = executor(receipts, clock, hub, {"ok": True}, failures)
        cmd = command(clock)
        run.submit(cmd, EPOCH)
        return cmd, await hub.next_result(), calls, failures

    cmd, posted, calls, failures = asyncio.run(go())
    assert posted == {"id": cmd["id"], "error": {"code": "runner_command_uncertain", "message": UNCERTAIN_MESSAGE}}
    assert calls == [], "never run without its started receipt"
    assert len(failures) == 1


def test_a_reply_of_the_wrong_shape_is_answered_as_runner_internal_error(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "runner-commands.sqlite3"

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        hub, failures = ScriptedHub(), list[ReceiptsError]()
        with Receipts(path, clock) as receipts:
            run, _ = executor(receipts, clock, hub, None, failures)

            async def no_code(_: dict[str, Any]) -> Any:
                raise CommandError("", "a handler forgot its code")

            run.handlers["gateway.rpc"] = no_code
            cmd = command(clock)
            run.submit(cmd, EPOCH)
            return cmd, await hub.next_result()

    cmd, posted = asyncio.run(go())
    assert posted["error"]["code"] == "runner_internal_error"
    assert stored_row(path, cmd["id"]) == ("complete", {"error": posted["error"]})
