"""The audit chain under concurrent writers (scale.md 2.4, acceptance scenario 11): eight processes of four engine
threads each run audited lifecycles on one PostgreSQL database for 30 s, every process with its own sealer. The
chain then verifies, ``seq`` is gapless, each job's events follow its revisions and nothing is left unsealed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.lifecycle import audit
from talaria.settings import Settings
from talaria.store.open import open_store
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql

PROCESSES, THREADS, SECONDS = 8, 4, 30
EVENTS_PER_JOB = (
    10  # task created, submitted, approved, dispatched; job enqueued, claimed, started, beat, done; reconciled
)


@pytest.fixture
def url(postgres_server: PostgresServer) -> Iterator[str]:
    with postgres_database(postgres_server, migrated=True) as made:
        yield made


def test_eight_processes_of_audited_lifecycles_leave_one_gapless_chain_in_revision_order(
    tmp_path: Path, url: str
) -> None:
    procs = []
    for i in range(PROCESSES):
        command = [sys.executable, "-m", "talaria.testing.audit_load", "--url", url, "--data-dir",
                   str(tmp_path / f"p{i}"), "--threads", str(THREADS), "--seconds", str(SECONDS)]  # fmt: skip
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=SECONDS + 240)
        assert proc.returncode == 0, err[-2000:] + out[-2000:]
        results.append(json.loads(out.splitlines()[-1]))
    jobs = sum(r["jobs"] for r in results)
    assert all(r["jobs"] > 0 for r in results), results
    assert sum(r["sealed"] for r in results) == jobs * EVENTS_PER_JOB  # each event sealed once, by some process

    settings = Settings(data_dir=tmp_path / "verify", database_url=url)
    # every process sealed what it committed as it stopped: nothing waits
    assert raw_sql(settings, "SELECT count(*) AS n FROM audit_pending")[0]["n"] == 0
    store = open_store(settings)
    try:
        report = audit.verify(store)
    finally:
        store.close()
    assert report.ok and report.unsealed == 0, report.line()
    assert report.events == jobs * EVENTS_PER_JOB  # gapless: verify walked seq 1..n without a gap
    assert report.line().startswith(f"audit chain OK: {jobs * EVENTS_PER_JOB} events")
    rows = raw_sql(
        settings,
        "SELECT job_id, revision_before, revision_after FROM audit_event WHERE type LIKE 'hermes.job.%'"
        " ORDER BY job_id, seq",
    )
    last: dict[str, int] = {}
    for row in rows:
        before = last.get(row["job_id"], 0)
        assert (row["revision_before"] or 0) == before, row  # each job's events follow its revisions
        last[row["job_id"]] = row["revision_after"]
    assert len(last) == jobs and set(last.values()) == {5}
