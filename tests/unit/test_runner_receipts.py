"""Runner receipts (runner-protocol.md sections 9 and 11.2): dedupe, uncertain after a restart,
compaction, sessions, durability settings."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from talaria.canonical import digest
from talaria.clock import ManualClock
from talaria.runner.receipts import (
    UNCERTAIN_MESSAGE,
    Conflict,
    Fresh,
    Receipts,
    ReceiptsError,
    Running,
    Stored,
    Uncertain,
    fingerprint,
)

CMD_ID = "5f0f3c8e-3d7a-4b59-9a0e-1f2d3c4b5a69"


def command(command_id: str = CMD_ID, **payload: Any) -> dict[str, Any]:
    return {
        "id": command_id,
        "kind": "http",
        "payload": payload or {"path": "/api/status", "method": "GET"},
        "expiresAt": 1_784_628_030_000,
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runner-commands.sqlite3"


def rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, fingerprint, state, result, created FROM commands ORDER BY id").fetchall()
    finally:
        conn.close()


# ---------------------------------------------------------------- fingerprint


def test_fingerprint_is_sha256_of_the_canonical_four_keys() -> None:
    cmd = command()
    assert fingerprint(cmd) == digest({k: cmd[k] for k in ("id", "kind", "payload", "expiresAt")})
    assert fingerprint({**cmd, "extra": 1}) == fingerprint(cmd)
    reordered = dict(reversed(list(cmd.items())))
    assert fingerprint(reordered) == fingerprint(cmd)
    assert fingerprint(command(path="/api/profiles")) != fingerprint(cmd)
    assert fingerprint({**cmd, "expiresAt": cmd["expiresAt"] + 1}) != fingerprint(cmd)
    assert Receipts.fingerprint(cmd) == fingerprint(cmd)
    assert len(fingerprint(cmd)) == 64


def test_fingerprint_needs_the_four_keys() -> None:
    cmd = command()
    del cmd["expiresAt"]
    with pytest.raises(ValueError, match="expiresAt"):
        fingerprint(cmd)


# ---------------------------------------------------------------- begin / complete


def test_fresh_then_running_then_stored(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        assert receipts.begin(command()) == Fresh()
        assert receipts.started_here(CMD_ID)
        assert rows(db) == [(CMD_ID, fingerprint(command()), "started", None, clock.now_ms())]
        assert receipts.begin(command()) == Running()
        reply = {"result": {"status": 200, "headers": {}, "body": "e30="}}
        assert receipts.complete(CMD_ID, reply) == reply
        assert not receipts.started_here(CMD_ID)
        assert receipts.begin(command()) == Stored(reply)


def test_a_different_fingerprint_is_a_conflict_in_every_state(db: Path, clock: ManualClock) -> None:
    other = command(path="/api/profiles")
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        assert receipts.begin(other) == Conflict()  # started
        receipts.complete(CMD_ID, {"result": 1})
        assert receipts.begin(other) == Conflict()  # complete
        clock.advance(3601)
        assert receipts.compact().retired == 1
        assert receipts.begin(other) == Conflict()  # retired


def test_a_restart_keeps_complete_replies_and_makes_started_uncertain(db: Path, clock: ManualClock) -> None:
    done, pending = command("a" * 8), command("b" * 8)
    with Receipts(db, clock) as receipts:
        assert receipts.begin(done) == Fresh()
        receipts.complete(done["id"], {"error": {"message": "nope", "code": "runner_http_forbidden"}})
        assert receipts.begin(pending) == Fresh()
        # the process "dies" here: `pending` is never completed
    with Receipts(db, clock) as receipts:
        assert receipts.begin(done) == Stored({"error": {"message": "nope", "code": "runner_http_forbidden"}})
        outcome = receipts.begin(pending)
        assert outcome == Uncertain()
        assert isinstance(outcome, Uncertain)
        assert outcome.message == UNCERTAIN_MESSAGE == "original command needs checking"
        assert not receipts.started_here(pending["id"])
        with pytest.raises(ReceiptsError):
            receipts.complete(pending["id"], {"result": 1})  # never replayed, never completed late
        assert receipts.begin(command("b" * 8, path="/x")) == Conflict()
        assert receipts.begin(command("c" * 8)) == Fresh()


CRASHER = """
import sys
from pathlib import Path
from talaria.clock import SystemClock
from talaria.runner.receipts import Receipts
receipts = Receipts(Path(sys.argv[1]), SystemClock())
cmd = {"id": sys.argv[2], "kind": "http", "payload": {}, "expiresAt": 1}
print(type(receipts.begin(cmd)).__name__, flush=True)
sys.stdin.readline()
"""


def test_a_crash_between_begin_and_complete_leaves_started(db: Path, clock: ManualClock) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(db), CMD_ID], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "Fresh"
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
    assert [r[2] for r in rows(db)] == ["started"]
    with Receipts(db, clock) as receipts:
        assert receipts.begin({"id": CMD_ID, "kind": "http", "payload": {}, "expiresAt": 1}) == Uncertain()


def test_concurrent_begins_run_the_command_once(db: Path, clock: ManualClock) -> None:
    outcomes: list[object] = []
    barrier = threading.Barrier(16)
    with Receipts(db, clock) as receipts:

        def deliver() -> None:
            barrier.wait()
            outcomes.append(receipts.begin(command()))

        threads = [threading.Thread(target=deliver) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert outcomes.count(Fresh()) == 1
    assert outcomes.count(Running()) == 15


def test_error_messages_are_cut_to_1000_characters(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        stored = receipts.complete(CMD_ID, {"error": {"message": "é" * 5000, "code": "hermes_unavailable"}})
        assert stored == {"error": {"message": "é" * 1000, "code": "hermes_unavailable"}}
        assert receipts.begin(command()) == Stored(stored)


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"result": 1, "error": {"message": "m", "code": "c"}},
        {"error": "boom"},
        {"error": {"message": "m"}},
        {"error": {"message": "m", "code": ""}},
        {"error": {"message": 1, "code": "c"}},
        {"error": {"message": "m", "code": "c", "extra": 1}},
        {"result": float("nan")},
    ],
)
def test_complete_refuses_a_reply_of_the_wrong_shape(db: Path, clock: ManualClock, reply: dict[str, Any]) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        with pytest.raises(ValueError):
            receipts.complete(CMD_ID, reply)
        assert receipts.started_here(CMD_ID)
        assert rows(db)[0][2] == "started"


def test_complete_refuses_an_unknown_or_completed_id(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        with pytest.raises(ReceiptsError):
            receipts.complete(CMD_ID, {"result": 1})
        receipts.begin(command())
        receipts.complete(CMD_ID, {"result": 1})
        with pytest.raises(ReceiptsError):
            receipts.complete(CMD_ID, {"result": 2})
        assert receipts.begin(command()) == Stored({"result": 1})


@pytest.mark.parametrize("bad", [{"kind": "http", "payload": {}, "expiresAt": 1}, {**command(), "id": 7}])
def test_begin_needs_a_string_id(db: Path, clock: ManualClock, bad: dict[str, Any]) -> None:
    with Receipts(db, clock) as receipts, pytest.raises(ValueError):
        receipts.begin(bad)


# ---------------------------------------------------------------- compaction


def test_compaction_retires_complete_rows_older_than_an_hour(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command("old"))
        receipts.complete("old", {"result": "x"})
        receipts.begin(command("stuck"))  # started rows are never compacted
        clock.advance(1800)
        receipts.begin(command("young"))
        receipts.complete("young", {"result": "y"})
        clock.advance(1800)
        assert receipts.compact().retired == 0  # exactly one hour: not older yet
        clock.advance(0.001)
        assert receipts.compact().retired == 1
        assert receipts.compact().retired == 0  # idempotent
        assert receipts.begin(command("old")) == Uncertain()
        assert receipts.begin(command("young")) == Stored({"result": "y"})
        assert receipts.begin(command("stuck")) == Running()
    by_id = {r[0]: r for r in rows(db)}
    assert by_id["old"][1:4] == (fingerprint(command("old")), "retired", None)
    assert by_id["young"][2] == "complete"
    assert by_id["stuck"][2] == "started"


def test_compaction_runs_at_start_up(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        receipts.complete(CMD_ID, {"result": 1})
    clock.advance(3601)
    with Receipts(db, clock) as receipts:
        assert rows(db)[0][2:4] == ("retired", None)
        assert receipts.begin(command()) == Uncertain()


def test_compaction_takes_an_explicit_time(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        receipts.complete(CMD_ID, {"result": 1})
        assert receipts.compact(clock.now_ms() + 3_600_001).retired == 1


def test_every_256th_handled_command_compacts(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        receipts.begin(command())
        receipts.complete(CMD_ID, {"result": 1})
        clock.advance(7200)
        assert [receipts.handled() for _ in range(255)] == [False] * 255
        assert rows(db)[0][2] == "complete"
        assert receipts.handled() is True
        assert rows(db)[0][2] == "retired"
        assert [receipts.handled() for _ in range(256)].count(True) == 1


# ---------------------------------------------------------------- sessions (11.2)


def test_sessions_are_recorded_and_survive_a_restart(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        assert receipts.session_profile("20260721_100000_abc") is None
        receipts.record_session("20260721_100000_abc", "coder")
        receipts.record_session("20260721_100000_abc", "coder")  # idempotent
        assert receipts.session_profile("20260721_100000_abc") == "coder"
    clock.advance(7200)
    with Receipts(db, clock) as receipts:
        assert receipts.session_profile("20260721_100000_abc") == "coder"
        receipts.record_session("20260721_100000_abc", "default")
        assert receipts.session_profile("20260721_100000_abc") == "default"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT stored_id, profile, created FROM sessions").fetchall() == [
            ("20260721_100000_abc", "default", clock.now_ms())
        ]
    finally:
        conn.close()


@pytest.mark.parametrize(("stored_id", "profile"), [("", "p"), ("s", ""), (None, "p")])
def test_record_session_needs_both_values(db: Path, clock: ManualClock, stored_id: Any, profile: str) -> None:
    with Receipts(db, clock) as receipts, pytest.raises(ValueError):
        receipts.record_session(stored_id, profile)


# ---------------------------------------------------------------- the file


def test_schema_wal_and_synchronous_full(db: Path, clock: ManualClock) -> None:
    with Receipts(db, clock) as receipts:
        conn = receipts._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.isolation_level is None  # explicit transactions only
    conn = sqlite3.connect(db)
    try:
        tables = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    finally:
        conn.close()
    assert tables["commands"] == (
        "CREATE TABLE commands(id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN ('started','complete','retired')), result TEXT, created INTEGER NOT NULL)"
    )
    assert tables["sessions"] == (
        "CREATE TABLE sessions(stored_id TEXT PRIMARY KEY, profile TEXT NOT NULL, created INTEGER NOT NULL)"
    )
    assert db.stat().st_mode & 0o077 == 0


def test_the_state_check_constraint_holds(db: Path, clock: ManualClock) -> None:
    Receipts(db, clock).close()
    conn = sqlite3.connect(db)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO commands VALUES ('x', 'f', 'running', NULL, 1)")
    finally:
        conn.close()


def test_a_file_from_a_newer_runner_is_refused(db: Path, clock: ManualClock) -> None:
    Receipts(db, clock).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ReceiptsError, match="newer runner"):
        Receipts(db, clock)


def test_a_file_that_is_not_sqlite_is_refused(db: Path, clock: ManualClock) -> None:
    db.write_bytes(b"not a database" * 100)
    with pytest.raises(ReceiptsError):
        Receipts(db, clock)


def test_a_missing_directory_is_refused(tmp_path: Path, clock: ManualClock) -> None:
    with pytest.raises(ReceiptsError):
        Receipts(tmp_path / "absent" / "runner-commands.sqlite3", clock)


def test_close_is_idempotent_and_final(db: Path, clock: ManualClock) -> None:
    receipts = Receipts(db, clock)
    receipts.close()
    receipts.close()
    with pytest.raises(ReceiptsError):
        receipts.begin(command())
    with pytest.raises(ReceiptsError):
        receipts.session_profile("s")
