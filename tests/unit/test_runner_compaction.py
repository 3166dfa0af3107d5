"""Receipt compaction on a timer (runner-protocol.md 9 and 14; ADR 0019): after 1 h a ``complete`` receipt is
retired and loses its reply, after 24 h a retired receipt and a session record not renewed are deleted, and the
runner compacts every minute even when no command arrives. Time is a ``ManualClock``; the timer's interval is
injected (a few ms here) and tests await its passes, never sleep.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.runner import limits
from talaria.runner.agent import Agent
from talaria.runner.compaction import Compactor
from talaria.runner.config import parse_config
from talaria.runner.receipts import Compacted, Receipts, ReceiptsError, Stored, Uncertain
from talaria.wire import WireReply

HOUR = 3600.0
DAY = 24 * HOUR
TICK_S = 0.002  # the injected timer interval


def command(command_id: str) -> dict[str, Any]:
    return {"id": command_id, "kind": "http", "payload": {"path": "/api/config", "method": "GET"}, "expiresAt": 1}


def table(path: Path, sql: str) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        return {row[0]: row[1:] for row in conn.execute(sql).fetchall()}
    finally:
        conn.close()


def commands(path: Path) -> dict[str, Any]:
    return table(path, "SELECT id, state, result FROM commands")


def sessions(path: Path) -> dict[str, Any]:
    return table(path, "SELECT stored_id, profile FROM sessions")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runner-commands.sqlite3"


def test_the_retention_limits() -> None:
    assert limits.RECEIPT_RETAIN_MS == 3_600_000
    assert limits.RECEIPT_DELETE_AFTER_MS == 86_400_000
    assert limits.SESSION_RECORD_RETAIN_MS == 86_400_000
    assert limits.RECEIPT_COMPACT_INTERVAL_S == 60


def test_after_an_hour_replies_are_dropped_and_after_a_day_retired_rows_and_stale_sessions_deleted(
    db: Path, clock: ManualClock
) -> None:
    large = {"result": "x" * 65536}
    with Receipts(db, clock) as receipts:
        receipts.begin(command("big"))
        receipts.complete("big", large)
        receipts.begin(command("stuck"))  # started: the no-replay evidence of a crash is never deleted
        receipts.record_session("s-old", "default")
        receipts.record_session("s-renewed", "default")

        clock.advance(HOUR + 0.001)
        receipts.compact()
        assert commands(db)["big"] == ("retired", None), "the large reply is gone after an hour"
        assert receipts.begin(command("big")) == Uncertain()

        clock.advance(22 * HOUR)
        receipts.record_session("s-renewed", "default")  # opened again: the record is renewed
        receipts.begin(command("late"))
        receipts.complete("late", {"result": 1})

        clock.set_ms(clock.now_ms() + round((DAY - 23 * HOUR - 0.001) * 1000))  # exactly 24 h after `big`
        receipts.compact()
        assert "big" in commands(db), "exactly a day old: not older yet"
        clock.advance(0.001)
        receipts.compact()
        rows = commands(db)
        assert "big" not in rows, "retired rows are deleted after a day"
        assert rows["stuck"] == ("started", None)
        assert rows["late"][0] == "complete"
        assert receipts.begin(command("late")) == Stored({"result": 1})
        assert sessions(db) == {"s-renewed": ("default",)}, "a record not renewed for a day is deleted"
        assert receipts.session_profile("s-old") is None

        clock.advance(DAY)
        receipts.compact()
        assert sessions(db) == {}
        assert set(commands(db)) == {"stuck"}


def test_compact_reports_what_it_did(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command("a"))
        receipts.complete("a", {"result": 1})
        receipts.record_session("s", "default")
        assert receipts.compact() == Compacted(retired=0, deleted=0, sessions=0)
        clock.advance(HOUR + 1)
        assert receipts.compact() == Compacted(retired=1, deleted=0, sessions=0)
        clock.advance(DAY)
        assert receipts.compact() == Compacted(retired=0, deleted=1, sessions=1)
        assert receipts.compact() == Compacted(retired=0, deleted=0, sessions=0), "idempotent"


# ---------------------------------------------------------------- the timer


def test_the_timer_compacts_a_quiet_runner_with_no_command_arriving(db: Path, clock: ManualClock) -> None:
    async def go() -> None:
        with Receipts(db, clock) as receipts:
            receipts.begin(command("big"))
            receipts.complete("big", {"result": "x" * 65536})
            receipts.record_session("s", "default")
            failures: list[ReceiptsError] = []
            timer = Compactor(receipts, interval_s=TICK_S, on_failure=failures.append)
            timer.start()
            try:
                assert (await timer.next_pass()) == Compacted(0, 0, 0)
                clock.advance(HOUR + 0.001)
                assert (await timer.next_pass()).retired == 1
                assert commands(db)["big"] == ("retired", None)
                clock.advance(DAY)
                assert (await timer.next_pass()) == Compacted(retired=0, deleted=1, sessions=1)
                assert commands(db) == {}
                assert sessions(db) == {}
                assert timer.passes >= 3
            finally:
                await timer.stop()
            assert failures == []

    asyncio.run(asyncio.wait_for(go(), 10))


def test_start_and_stop_are_idempotent_and_stop_is_safe_before_start(db: Path, clock: ManualClock) -> None:
    async def go() -> None:
        with Receipts(db, clock) as receipts:
            timer = Compactor(receipts, interval_s=TICK_S, on_failure=lambda exc: None)
            await timer.stop()  # before start: nothing to do
            timer.start()
            timer.start()  # one loop, not two
            await timer.next_pass()
            await timer.stop()
            await timer.stop()
            stopped_at = timer.passes
            await asyncio.sleep(TICK_S * 3)  # a few ms: a leftover loop would run in them
            assert timer.passes == stopped_at
            timer.start()  # a stopped timer starts again
            await timer.next_pass()
            await timer.stop()

    asyncio.run(asyncio.wait_for(go(), 10))


def test_the_default_interval_is_a_minute(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        assert Compactor(receipts, on_failure=lambda exc: None).interval_s == 60


def test_a_compaction_the_file_refuses_is_reported_and_ends_the_timer(db: Path, clock: ManualClock) -> None:
    async def go() -> list[ReceiptsError]:
        failures: list[ReceiptsError] = []
        reported = asyncio.Event()

        def on_failure(exc: ReceiptsError) -> None:
            failures.append(exc)
            reported.set()

        receipts = Receipts(db, clock)
        timer = Compactor(receipts, interval_s=TICK_S, on_failure=on_failure)
        receipts.close()  # every later use of the file fails
        timer.start()
        await asyncio.wait_for(reported.wait(), 5)
        await timer.stop()
        return failures

    failures = asyncio.run(go())
    assert len(failures) == 1
    assert "closed" in str(failures[0])


# ---------------------------------------------------------------- the runner runs the timer


class QuietHub:
    """The hub's wire for an idle runner: the first poll connects, later ones wait until cancelled."""

    def __init__(self) -> None:
        self.polls = 0

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        if target.endswith("/poll"):
            self.polls += 1
            if self.polls > 1:
                await asyncio.Event().wait()  # a held poll; the stop cancels it
            return WireReply(200, {}, json.dumps({"epoch": "e1", "commands": []}).encode())
        return WireReply(200, {}, b'{"ok": true}')

    async def aclose(self) -> None:
        return None


def test_the_runner_compacts_on_its_timer_while_no_command_arrives(
    tmp_path: Path, db: Path, clock: ManualClock
) -> None:
    config = parse_config(
        {
            "protocol": 1,
            "serverURL": "http://127.0.0.1:9",
            "runnerId": str(uuid.uuid4()),
            "token": "t" * 43,
            "allowedProfiles": ["default"],
        }
    )

    async def go() -> int:
        with Receipts(db, clock) as receipts:
            receipts.begin(command("big"))
            receipts.complete("big", {"result": "x" * 65536})
            agent = Agent(config, receipts, clock, out=io.StringIO(), hub_wire=QuietHub(), compact_interval_s=TICK_S)
            run = asyncio.get_running_loop().create_task(agent.run())
            await agent.connected_event.wait()
            clock.advance(HOUR + 0.001)
            assert (await agent.compactor.next_pass()).retired == 1
            assert commands(db)["big"] == ("retired", None)
            agent.request_stop()
            code = await run
            assert agent.compactor.running is False, "the runner's stop stops the timer"
            return code

    assert asyncio.run(asyncio.wait_for(go(), 20)) == 0


# ---------------------------------------------------------------- the file stays bounded

MAX_FILE_BYTES = 2 * 1024 * 1024  # runner-commands.sqlite3 (ADR 0019)
MAX_WAL_BYTES = 4_718_592  # its -wal file: 4.5 MiB (SQLite checkpoints at 1,000 pages of 4 KiB)


def test_ten_thousand_commands_keep_the_receipts_file_under_2_mib(db: Path, clock: ManualClock) -> None:
    """One command a minute for about a week, each with a 4 KiB reply and one compaction pass a minute (what the
    timer does). Without deletion the file reaches about 6.1 MB; without retiring, the replies alone are 41 MB."""
    wal = db.with_name(db.name + "-wal")
    with Receipts(db, clock) as receipts:
        receipts._conn.execute("PRAGMA synchronous=OFF")  # size is under test here, not durability: keep it fast
        peak, wal_peak = 0, 0
        for index in range(10_000):
            command_id = str(uuid.uuid4())
            receipts.begin(command(command_id))
            receipts.complete(command_id, {"result": "x" * 4096})
            receipts.handled()
            clock.advance(60)
            receipts.compact()
            if index % 50 == 0 or index == 9_999:
                peak, wal_peak = max(peak, db.stat().st_size), max(wal_peak, wal.stat().st_size)
        states = [row[0] for row in commands(db).values()]
    assert peak < MAX_FILE_BYTES, peak
    assert wal_peak < MAX_WAL_BYTES, wal_peak
    assert states.count("complete") <= 61  # one hour of replies
    assert states.count("retired") <= 24 * 60 + 1  # one day of tombstones
