"""``talaria runner --config PATH`` as real processes against a real hub (runner-protocol.md 3, 5.2, 9; web-api.md 8).

The hub runs on the system clock: the runner compares ``expiresAt`` with real time. No Hermes is needed: the
commands used here are refused by the runner's allow-list after admission, without a Hermes request.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import SystemClock
from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.testing.hub_server import HubServer
from tests.integration.runner_support import (
    OFF_LIST,
    RunnerProcess,
    admin_of,
    clean_env,
    inject,
    outcome,
    register,
    runner_summary,
    send_captured,
    wait_until,
    write_config,
)

STOPPED = "runner stopped"
CONNECTED = "runner connected"


pytestmark = pytest.mark.usefixtures("fast_argon2")


class Site:
    """A hub on the system clock, an admin client, one registered runner and the runner processes started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.server = HubServer(tmp_path / "data", SystemClock()).start()
        self.admin = admin_of(self.server)
        registered = register(self.admin, hermesURL=f"http://127.0.0.1:{closed_port()}")
        self.id: str = registered["runner"]["id"]
        self.token: str = registered["token"]
        self.config: dict[str, Any] = registered["config"]
        self.processes: list[RunnerProcess] = []

    def write(self, directory: str = "node", mode: int = 0o600, config: dict[str, Any] | None = None) -> Path:
        return write_config(self.tmp / directory, self.config if config is None else config, mode)

    def start(self, config_path: Path, name: str = "runner") -> RunnerProcess:
        process = RunnerProcess(config_path, self.tmp / "logs", f"{name}-{len(self.processes)}")
        self.processes.append(process)
        return process

    def running(self, directory: str = "node") -> RunnerProcess:
        process = self.start(self.write(directory))
        process.wait_for(CONNECTED)
        return process

    def summary(self) -> dict[str, Any]:
        return runner_summary(self.admin, self.id)

    def close(self) -> None:
        for process in self.processes:
            process.close()
        for process in self.processes:
            process.assert_silent_about(self.token)
        self.admin.close()
        self.server.stop()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    made = Site(tmp_path)
    try:
        yield made
    finally:
        made.close()


def closed_port() -> int:
    """A loopback port nothing listens on: Hermes is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def assert_stopped_last(process: RunnerProcess) -> None:
    assert process.lines, process.stderr
    assert process.lines[-1] == STOPPED, process.stderr


def fingerprint(wire: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no whitespace, UTF-8) of id, kind, payload, expiresAt."""
    command = {key: wire[key] for key in ("id", "kind", "payload", "expiresAt")}
    text = json.dumps(command, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- configuration (section 3) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o710], ids=oct)
def test_a_config_readable_by_group_or_other_is_refused_with_exit_2(site: Site, mode: int) -> None:
    process = site.start(site.write(mode=mode))
    assert process.wait(10) == 2, process.stderr
    assert "chmod 600" in process.stderr
    process.assert_silent_about(site.token)
    assert site.summary()["lastSeenAt"] is None, "no request was made"


def test_a_config_of_mode_0600_connects_and_sigterm_stops_it_with_exit_0(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    path = site.write()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    process = site.start(path)
    process.wait_for(CONNECTED)
    summary = site.summary()
    assert summary["online"] is True
    assert summary["connectedAt"] is not None
    state = path.parent / "state" / site.id
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert (state / "runner-commands.sqlite3").is_file()
    started = time.monotonic()
    assert process.stop(signal.SIGTERM, timeout=12) == 0, process.stderr
    assert time.monotonic() - started < 12
    assert_stopped_last(process)
    assert process.lines.count(CONNECTED) == 1
    summary = site.summary()
    assert (summary["online"], summary["connectedAt"]) == (False, None), "goodbye disconnects at once"
    process.assert_silent_about(site.token)
    assert site.token not in caplog.text, "the hub never logs the token"


def test_sigint_is_a_graceful_stop_too(site: Site) -> None:
    process = site.running()
    assert process.stop(signal.SIGINT, timeout=12) == 0, process.stderr
    assert_stopped_last(process)
    assert site.summary()["connectedAt"] is None


def test_invalid_configurations_exit_2_naming_the_field_and_never_printing_the_token(site: Site) -> None:
    cases: list[tuple[dict[str, Any] | str, str]] = [
        (site.config | {"command": "sh -c true"}, "command"),
        (site.config | {"protocol": 2}, "protocol"),
        ({k: v for k, v in site.config.items() if k != "token"}, "token"),
        (site.config | {"hermesURL": "http://localhost:9119"}, "hermesURL"),
        (site.config | {"allowedProfiles": []}, "allowedProfiles"),
        (site.config | {"runnerId": site.id.upper()}, "runnerId"),
        (
            site.config | {"hermesCredentials": {"username": "u", "password": "secret-pass", "x": 1}},
            "hermesCredentials",
        ),
        (site.config | {"hermesTokenFile": "relative/token"}, "hermesTokenFile"),
        (json.dumps(site.config)[:-5], ""),
    ]
    for index, (config, field) in enumerate(cases):
        directory = site.tmp / f"bad{index}"
        directory.mkdir()
        path = directory / "runner.json"
        path.write_text(config if isinstance(config, str) else json.dumps(config), encoding="utf-8")
        path.chmod(0o600)
        process = site.start(path, f"bad{index}")
        assert process.wait(10) == 2, (field, process.stderr)
        assert field in process.stderr, (field, process.stderr)
        process.assert_silent_about(site.token, "secret-pass")
    assert site.summary()["lastSeenAt"] is None


def test_a_second_runner_on_the_same_state_directory_exits_2(site: Site) -> None:
    first = site.running()
    second = site.start(site.tmp / "node" / "runner.json", "second")
    assert second.wait(10) == 2, second.stderr
    assert "another runner uses" in second.stderr
    assert first.proc.poll() is None, "the first runner keeps its lock and runs on"
    assert site.summary()["online"] is True
    assert first.stop() == 0
    third = site.running()  # the lock was released
    assert third.stop() == 0


def test_a_hub_restarted_within_the_failover_window_is_ridden_out_and_its_new_epoch_adopted(site: Site) -> None:
    """failover-v1 (scale.md 3.5): 503 hub_shutting_down and refused connections within 20 s are no disconnect;
    the restarted SQLite hub's new epoch is (runner connected again, without a disconnect line)."""
    process = site.running()
    site.server.stop()  # held polls answer 503 hub_shutting_down, then nothing listens
    site.server.start()
    process.wait_for("runner connected", count=2)
    assert not [line for line in process.lines if line.startswith("runner disconnected")], process.stderr
    assert process.stop() == 0, process.stderr
    assert_stopped_last(process)


def test_a_hub_away_past_the_failover_window_prints_runner_disconnected_and_the_runner_retries(site: Site) -> None:
    process = site.running()
    site.server.stop()
    # the first failure is 503 hub_shutting_down, ridden out; 20 s after the last good poll was sent, the failure
    # then (a refused connection) is a local disconnect
    wait_until(lambda: any(line.startswith("runner disconnected: ") for line in process.lines), what="the line",
               timeout=45)  # fmt: skip
    assert "runner disconnected: transport" in process.lines, process.stderr
    # retries (transport errors) never stop the runner, only terminal codes do: it is back once the hub is
    site.server.start()
    process.wait_for("runner connected", count=2)
    assert process.proc.poll() is None, process.stderr
    assert process.stop() == 0, process.stderr
    assert_stopped_last(process)


# --- terminal refusals (section 3) --------------------------------------------------------------------------------


def test_a_disabled_runner_stops_for_good_with_exit_3_and_says_to_register_again(site: Site) -> None:
    process = site.running()
    assert site.admin.delete(f"/api/admin/runners/{site.id}").json() == {"ok": True}
    assert process.wait(10) == 3, process.stderr
    assert_stopped_last(process)
    explanation = process.lines[-2].lower()
    assert "disabled" in explanation, process.stderr
    assert "token" in explanation, process.stderr
    assert "regist" in explanation, process.stderr
    assert process.lines.count(CONNECTED) == 1


def test_a_replaced_runner_process_is_fenced_and_exits_3(site: Site) -> None:
    first = site.running()
    copy = site.tmp / "copy"
    copy.mkdir()
    shutil.copy2(site.tmp / "node" / "runner.json", copy / "runner.json")
    second = site.start(copy / "runner.json", "second")
    second.wait_for(CONNECTED)
    assert first.wait(10) == 3, first.stderr
    assert_stopped_last(first)
    assert "runner_instance_retired" in first.stderr or "replaced" in first.stderr, first.stderr
    time.sleep(0.5)
    assert second.proc.poll() is None, second.stderr
    assert second.lines.count(CONNECTED) == 1, "the retired instance never took the state back"
    assert site.summary()["online"] is True
    assert second.stop() == 0


# --- runner outcomes relayed by a hub route (section 14, web-api.md 4) ------------------------------------------


def test_the_profiles_route_relays_the_runners_outcome(site: Site) -> None:
    offline = site.admin.get("/api/sources/local/profiles")
    assert (offline.status_code, offline.json()["code"]) == (503, "runner_offline")
    process = site.running()
    response = site.admin.get("/api/sources/local/profiles")
    assert response.status_code == 502, response.text
    assert response.json()["code"] == "hermes_unavailable", "Hermes is down: the runner's code, as 502"
    assert process.stop() == 0


# --- receipts across a restart (section 9) ---------------------------------------------------------------------


def test_after_a_restart_the_receipts_answer_redelivered_ids_and_never_replay(site: Site) -> None:
    config_path = site.write()
    first = site.start(config_path)
    first.wait_for(CONNECTED)
    task, wire = send_captured(site.server, site.id)
    error = outcome(site.server, task)
    assert isinstance(error, TalariaError)
    assert (error.code, error.status) == ("runner_http_forbidden", 403), "executed after admission"
    assert first.stop() == 0

    receipts = config_path.parent / "state" / site.id / "runner-commands.sqlite3"
    marker = {"result": {"stored": "reply from the receipt"}}
    started = {"id": str(uuid.uuid4()), "kind": "http", "payload": dict(OFF_LIST), "expiresAt": wire["expiresAt"]}
    retired = started | {"id": str(uuid.uuid4())}
    with sqlite3.connect(receipts) as db:
        row = db.execute("SELECT fingerprint, state, result FROM commands WHERE id = ?", (wire["id"],)).fetchone()
        assert row is not None
        assert row[0] == fingerprint(wire)
        assert row[1] == "complete"
        assert json.loads(row[2])["error"]["code"] == "runner_http_forbidden"
        # The stored reply is replaced by a marker, so that a posted reply can only come from the receipt.
        db.execute("UPDATE commands SET result = ? WHERE id = ?", (json.dumps(marker), wire["id"]))
        now = int(time.time() * 1000)
        insert = "INSERT INTO commands(id, fingerprint, state, result, created) VALUES (?, ?, ?, NULL, ?)"
        db.execute(insert, (started["id"], fingerprint(started), "started", now))
        db.execute(insert, (retired["id"], fingerprint(retired), "retired", now))
    db.close()

    second = site.start(config_path, "restarted")
    second.wait_for(CONNECTED)
    assert outcome(site.server, inject(site.server, site.id, wire)) == marker["result"]
    for command in (started, retired):
        uncertain = outcome(site.server, inject(site.server, site.id, command))
        assert isinstance(uncertain, TalariaError)
        assert (uncertain.code, uncertain.status) == ("runner_command_uncertain", 504)
        assert uncertain.message == "original command needs checking"
    conflicting = wire | {"payload": dict(OFF_LIST, search="?other=1")}
    conflict = outcome(site.server, inject(site.server, site.id, conflicting))
    assert isinstance(conflict, TalariaError)
    assert conflict.code == "idempotency_conflict"
    with sqlite3.connect(receipts) as db:
        states = dict(db.execute("SELECT id, state FROM commands").fetchall())
    db.close()
    assert states == {wire["id"]: "complete", started["id"]: "started", retired["id"]: "retired"}
    assert second.stop() == 0


# --- the admin command line (web-api.md 8) -----------------------------------------------------------------------


def talaria(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "talaria", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_register_to_a_path_that_cannot_be_written_registers_nothing(site: Site) -> None:
    data = str(site.tmp / "data")
    out = site.tmp / "missing-directory" / "runner.json"
    refused = talaria(
        "admin", "runners", "register", "--data-dir", data, "--name", "lost", "--source", "lab",
        "--profile", "default", "--server-url", site.server.url, "--out", str(out), cwd=site.tmp,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"talaria: cannot write {out}: No such file or directory; nothing was registered"
    assert "Traceback" not in refused.stderr
    listed = talaria("admin", "runners", "list", "--data-dir", data, cwd=site.tmp)
    assert "lost" not in listed.stdout, "no runner whose token nobody has"

    kept = site.tmp / "kept" / "runner.json"
    kept.parent.mkdir()
    kept.write_text("an earlier runner.json\n")
    duplicate = talaria(
        "admin", "runners", "register", "--data-dir", data, "--name", "again", "--source", "local",
        "--profile", "default", "--server-url", site.server.url, "--out", str(kept), cwd=site.tmp,
    )  # fmt: skip
    assert duplicate.returncode == 1, duplicate.stderr
    assert "already has an enabled runner" in duplicate.stderr
    assert kept.read_text() == "an earlier runner.json\n", "a refused registration leaves the file as it was"
    assert [p.name for p in kept.parent.iterdir()] == ["runner.json"], "no partial file left"


def test_admin_runners_register_list_and_disable_from_the_command_line(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Disable takes effect at the runner's next request; a shorter poll hold (at most 15 s) brings it sooner.
    monkeypatch.setattr(limits, "POLL_HOLD_S", 1)
    data = str(site.tmp / "data")
    out = site.tmp / "cli-node" / "runner.json"
    out.parent.mkdir()
    registered = talaria(
        "admin", "runners", "register", "--data-dir", data, "--name", "cli node", "--source", "lab",
        "--profile", "default", "--profile", "research", "--profile", "default",
        "--server-url", site.server.url, "--out", str(out), cwd=site.tmp,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.strip().splitlines()[-1] == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    config = json.loads(out.read_text(encoding="utf-8"))
    assert set(config) == {
        "protocol",
        "serverURL",
        "runnerId",
        "token",
        "hermesURL",
        "allowedProfiles",
        "artifactRoots",
    }
    assert config["protocol"] == 1
    assert config["serverURL"] == site.server.url
    assert config["hermesURL"] == "http://127.0.0.1:9119"
    assert config["allowedProfiles"] == ["default", "research"]
    assert config["artifactRoots"] == []
    token = config["token"]
    assert len(token) == 43
    assert token not in registered.stdout + registered.stderr

    listed = talaria("admin", "runners", "list", "--data-dir", data, cwd=site.tmp)
    assert listed.returncode == 0, listed.stderr
    assert config["runnerId"] in listed.stdout
    assert site.id in listed.stdout
    assert token not in listed.stdout + listed.stderr
    assert hashlib.sha256(token.encode()).hexdigest() not in listed.stdout + listed.stderr
    api = runner_summary(site.admin, config["runnerId"])
    assert (api["source"], api["name"], api["enabled"]) == ("lab", "cli node", True)

    process = site.start(out, "cli")
    process.wait_for(CONNECTED)
    wait_until(lambda: runner_summary(site.admin, config["runnerId"])["online"], what="the CLI runner online")
    disabled = talaria("admin", "runners", "disable", "--data-dir", data, config["runnerId"], cwd=site.tmp)
    assert disabled.returncode == 0, disabled.stderr
    assert process.wait(10) == 3, process.stderr
    assert_stopped_last(process)
    assert "regist" in process.lines[-2].lower(), process.stderr
    assert token not in process.stdout + process.stderr
    assert runner_summary(site.admin, config["runnerId"])["enabled"] is False
    unknown = talaria("admin", "runners", "disable", "--data-dir", data, str(uuid.uuid4()), cwd=site.tmp)
    assert unknown.returncode == 1
