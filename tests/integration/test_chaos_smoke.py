"""``make chaos-smoke`` inside ``make test`` (issue 17): ``bench/chaos.py --smoke`` over real processes — a hub on
SQLite, three runners, their Hermes fixtures and the fault proxy — with each fault kind injected once and stale
writes tried on purpose; and the same with two hub replicas of one PostgreSQL database (``--postgres``), the fault
proxy balancing the runners between them; and on SQLite with runner ``n1`` in front of a real ``hermes serve`` and
the scripted model (``--real-hermes``), team goals through the team tools in the work. Its JSON verdict must show no
duplicate, no silent loss, no accepted stale write and a verifying audit chain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from talaria.testing import postgres_server
from tests.integration.cli_support import clean_env

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT_S = 480  # under pytest's 600 s per test; the run takes about a minute alone
FAULTS = ("hub_kill", "runner_kill", "reset", "half_open", "partition", "latency")


@pytest.mark.parametrize(("backend", "real_hermes"), [("sqlite", False), ("postgresql", False), ("sqlite", True)],
                         ids=["sqlite", "postgresql", "sqlite-real-hermes"])  # fmt: skip
def test_the_chaos_smoke_run_keeps_every_promise(
    backend: str, real_hermes: bool, request: pytest.FixtureRequest
) -> None:  # fmt: skip
    argv = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--smoke"]
    if real_hermes:
        request.getfixturevalue("hermes_executable")  # fails saying how to install Hermes when it is missing
        argv.append("--real-hermes")
    if backend == "postgresql":
        try:
            postgres_server.find_binaries()
        except postgres_server.PostgresMissing as missing:
            if postgres_server.required():
                raise
            pytest.skip(str(missing))
        argv.append("--postgres")
    # the run starts its own PostgreSQL: it finds the binaries as the check above did
    # (and Hermes as the tests find it)
    bindir = {k: v for k, v in os.environ.items() if k in (postgres_server.ENV_BINDIR, "TALARIA_HERMES_BIN")}
    # its own process group: a run cut short takes its hub and runners with it
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env=clean_env(**bindir), start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=RUN_LIMIT_S)
    finally:
        if proc.poll() is None:  # SIGTERM first: the run then stops what it started (real Hermes included)
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    lines = out.strip().splitlines()
    assert lines, f"no verdict; stderr:\n{err[-4000:]}"
    verdict = json.loads(lines[-1])
    shown = json.dumps(verdict, indent=1) + "\n" + err[-3000:]
    assert verdict["duplicates"] == 0, shown
    assert verdict["silent_losses"] == 0, shown
    assert verdict["misreported"] == 0, shown
    assert verdict["stale_writes_accepted"] == 0, shown
    assert verdict["stale_writes_attempted"]["epoch"] >= 2, shown  # result and admit of the killed instance
    assert verdict["stale_writes_attempted"]["lease"] >= 2, shown  # heartbeat and complete of the expired lease
    assert verdict["commands"]["executed"] >= verdict["commands"]["target"], shown
    assert verdict["audit_ok"] is True, shown
    assert verdict["errors"] == [], shown
    assert verdict["sizes_over_limit"] == [], shown
    assert all(verdict["faults"].get(kind, 0) >= 1 for kind in FAULTS), shown
    assert sum(verdict["jobs"].values()) >= 24, shown
    assert sum(verdict["turns"].values()) >= 9, shown
    assert verdict["backend"] == backend, shown
    if real_hermes:  # a share of the work really ran in Hermes, counted from the model server's log
        assert verdict["hermes"] == "real n1" and verdict["runs_in_real_hermes"] >= 10, shown
        assert verdict["peak_rss_mib"]["n1_hermes"] > 0, shown
        # team goals through the team tools: at least two tried, and at least one completed (the run goes on until
        # one has started after the last fault)
        assert sum(verdict["goals"].values()) >= 2 and verdict["goals"].get("complete", 0) >= 1, shown
    if backend == "postgresql":  # both replicas served and were sampled
        assert set(verdict["peak_rss_mib"]) >= {"hub_a", "hub_b"}, shown
        assert verdict["sizes_mib"]["postgres_database"] > 0, shown
    assert verdict["ok"] is True, shown
    assert proc.returncode == 0, shown
