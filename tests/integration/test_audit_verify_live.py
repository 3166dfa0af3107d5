"""``audit verify`` on a live hub (lifecycle.md 8; issue 11, defect 3): always OK while jobs run.

A real hub with the Runtime API; 20 jobs go through dispatch, claim, start, heartbeats and complete on four worker
threads, while two threads loop ``GET /api/audit/verify`` and another runs ``talaria audit verify --data-dir`` as a
process. Every answer must be OK: before verify read one snapshot, an event committed between its scan and its read
of the chain head was reported as ``seq_gap``. The workers start once every verifier has answered once and keep
heartbeating until each has answered a set number of times more, so the verifiers overlap the writes by count, not
by time; the verifiers stop after one more answer once the last job is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.testing.hub_server import HubServer
from tests.conftest import PROXY_SECRET, add_account, login
from tests.integration.cli_support import talaria
from tests.integration.runtime_support import Worker, close_clients, dispatched_job

JOBS = 20
WORKER_THREADS = 4
MIN_HEARTBEATS = 3  # per job, then more until the verifiers have overlapped enough
API_VERIFIERS = 2  # concurrent GET /api/audit/verify loops
API_CHECKS_DURING = 150  # answers each API verifier gives while the jobs run (before the fix, ~1 in 50 was broken)
CLI_CHECKS_DURING = 5


pytestmark = pytest.mark.usefixtures("fast_argon2")


@pytest.fixture
def hub(make_hub: Callable[..., HubServer]) -> Iterator[HubServer]:
    server = make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET)
    add_account(server, "ada", "admin")
    yield server
    close_clients()


class Verifier:
    """One verifier loop on its own thread: ``check()`` returns (ok, text); answers are kept in order."""

    def __init__(self, name: str, check: Callable[[], tuple[bool, str]], stop: threading.Event) -> None:
        self.name = name
        self._check = check
        self._stop = stop
        self.answers: list[tuple[bool, str]] = []
        self.first = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"verify-{name}", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Verifier:
        self._thread.start()
        return self

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def _run(self) -> None:
        try:
            while True:
                # Read the flag first: an answer begun after the last job finished ends the loop.
                last = self._stop.is_set()
                answer = self._check()
                with self._lock:
                    self.answers.append(answer)
                self.first.set()
                if last:
                    return
        except BaseException as exc:  # surfaced by join()
            self.error = exc
            self.first.set()

    def join(self) -> list[tuple[bool, str]]:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), f"the {self.name} verifier did not stop"
        if self.error is not None:
            raise self.error
        return self.answers


@pytest.mark.slow
def test_audit_verify_is_ok_all_along_while_20_jobs_run(hub: HubServer, tmp_path: Path) -> None:
    admins = [login(hub, "ada") for _ in range(API_VERIFIERS)]
    done = threading.Event()

    def api_check(admin: httpx.Client) -> Callable[[], tuple[bool, str]]:
        def check() -> tuple[bool, str]:
            response = admin.get("/api/audit/verify")
            body: dict[str, Any] = response.json()
            return response.status_code == 200 and body.get("ok") is True, f"{response.status_code} {body}"

        return check

    def cli_check() -> tuple[bool, str]:
        result = talaria("audit", "verify", "--data-dir", str(hub.data_dir), cwd=tmp_path)
        text = (result.stdout + result.stderr).strip()
        return result.returncode == 0 and text.startswith("audit chain OK: "), f"exit {result.returncode}: {text}"

    apis = [Verifier(f"api-{n}", api_check(admin), done).start() for n, admin in enumerate(admins)]
    cli = Verifier("cli", cli_check, done).start()
    verifiers = [*apis, cli]
    assert all(v.first.wait(60) for v in verifiers), "every verifier answered once"
    base = {v.name: v.count() for v in verifiers}
    wanted = {v.name: API_CHECKS_DURING for v in apis} | {cli.name: CLI_CHECKS_DURING}

    def overlapped() -> bool:
        if any(v.error is not None for v in verifiers):
            return True  # a verifier failed: finish the jobs, join() raises its error
        return all(v.count() - base[v.name] >= wanted[v.name] for v in verifiers)

    def run_job(n: int) -> str:
        job, binding = dispatched_job(hub)
        worker = Worker.of(hub, job, binding, f"worker-{n % WORKER_THREADS}")
        response = worker.claim(f"w-{n}")
        assert response.status_code == 200, response.text
        response = worker.start()
        assert response.status_code == 200, response.text
        beats = 0
        while beats < MIN_HEARTBEATS or not overlapped():
            response = worker.heartbeat({"beat": beats})
            assert response.status_code == 200, response.text
            beats += 1
        response = worker.complete()
        assert response.status_code == 200, response.text
        return str(response.json()["state"])

    try:
        with ThreadPoolExecutor(max_workers=WORKER_THREADS) as pool:
            states = list(pool.map(run_job, range(JOBS)))
    finally:
        done.set()
        answers = {v.name: v.join() for v in verifiers}
        for admin in admins:
            admin.close()
    assert states == ["SUCCEEDED"] * JOBS
    assert all(len(answers[name]) - base[name] > wanted[name] for name in answers), {
        n: len(a) for n, a in answers.items()
    }
    every = [answer for name in answers for answer in answers[name]]
    broken = [text for ok, text in every if not ok]
    assert broken == [], f"{len(broken)} of {len(every)} answers not OK: {broken[:5]}"
    final = hub.hub.engine.verify_audit()
    assert final.ok, final.line()
    assert answers[cli.name][-1][1] == f"exit 0: {final.line()}", "the last CLI answer saw the finished chain"
