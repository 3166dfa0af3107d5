"""``talaria demo``: the product end to end on the embedded default, with real processes.

Starts ``talaria hub`` (Runtime API on, a per-run proxy secret) on a fresh data directory, creates
an author and an approver with ``talaria admin create-user``, writes, submits and approves a task
through the JSON API, runs its job to completion with a signed Runtime API worker, checks the
audit chain with ``talaria audit verify``, and leaves the hub serving until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from talaria.testing.runtime_client import RuntimeClient


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def _talaria(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "talaria", *args], input=stdin, capture_output=True, text=True, env=env, check=False
    )


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"{what} failed: HTTP {response.status_code} {response.text}")
    data: dict[str, Any] = response.json()
    return data


def _start_hub(data_dir: Path, port: int, secret: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, TALARIA_RUNTIME_API_ENABLED="true", TALARIA_RUNTIME_API_PROXY_SECRET=secret)
    log = (data_dir / "hub.log").open("w")
    hub = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "talaria", "hub", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    assert hub.stdout is not None
    line = hub.stdout.readline().strip()
    prefix = "talaria hub listening on "
    if not line.startswith(prefix):
        hub.kill()
        raise RuntimeError(f"the hub did not start; see {data_dir / 'hub.log'}")
    return hub, line.removeprefix(prefix)


def _login(url: str, username: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=10.0, headers={"Origin": url})
    me = _check(client.post("/api/auth/login", json={"username": username, "password": password}), "sign-in")
    client.headers["X-CSRF-Token"] = me["csrfToken"]
    return client


def run_demo(*, keep_serving: bool = True, port: int = 0) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="talaria-demo-"))
    secret = secrets.token_urlsafe(32)
    _step(f"data directory {data_dir} (SQLite, WAL, synchronous=FULL)")
    passwords = {"alice": secrets.token_urlsafe(12), "bob": secrets.token_urlsafe(12)}
    for username, role in (("alice", "user"), ("bob", "admin")):
        done = _talaria(
            "admin", "create-user", "--data-dir", str(data_dir), "--username", username, "--role", role,
            "--allow", "local:default", stdin=passwords[username] + "\n",
        )  # fmt: skip
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        _step(done.stdout.strip())
    secrets_file = data_dir / "demo-passwords.txt"
    secrets_file.write_text("".join(f"{u} {p}\n" for u, p in passwords.items()))
    secrets_file.chmod(0o600)
    _step(f"demo passwords are in {secrets_file} (mode 600)")

    hub, url = _start_hub(data_dir, port, secret)
    _step(f"hub listening on {url} with the internal Runtime API on (loopback only, signed proxy identity)")
    try:
        alice, bob = _login(url, "alice", passwords["alice"]), _login(url, "bob", passwords["bob"])
        task = _check(
            alice.post("/api/tasks", json={"title": "Summarise the release notes", "prompt": "Summarise them.",
                                           "cell": "local", "profile": "default"}),
            "create task",
        )["task"]  # fmt: skip
        _step(f"alice wrote task {task['id']} ({task['state']})")
        task = _check(alice.post(f"/api/tasks/{task['id']}/submit"), "submit")["task"]
        _step(f"alice submitted it ({task['state']})")
        approved = _check(bob.post(f"/api/tasks/{task['id']}/approve"), "approve")
        job = approved["job"]
        _step(
            f"bob approved it: task {approved['task']['state']}, dispatch {approved['dispatch']['id']}, "
            f"job {job['id']} {job['state']}"
        )

        worker = RuntimeClient(url, secret, principal="demo-worker", roles="runtime")
        listed = _check(worker.discover("local", "default"), "discover")["jobs"]
        binding = worker.binding(next(j for j in listed if j["binding"]["job"] == job["id"]))
        claim = _check(worker.post(job["id"], "claim", {"binding": binding, "worker_instance": "demo-1"}), "claim")
        lease = {"lease_id": claim["lease"]["lease_id"], "lease_epoch": claim["lease"]["lease_epoch"]}
        _step(f"worker claimed it: attempt {claim['attempt']}, lease epoch {lease['lease_epoch']}")
        started = _check(worker.post(job["id"], "start", {"binding": binding, **lease}), "start")
        _step(f"worker started it ({started['state']})")
        beat = _check(
            worker.post(job["id"], "heartbeat", {"binding": binding, **lease, "progress": {"step": 1}}), "heartbeat"
        )
        _step(f"worker heartbeat: lease extended to {beat['expires_at']}")
        result = {"outputs": {"reply": "The release adds durable jobs."}, "artifacts": [], "summary": "Summarised."}
        finished = _check(
            worker.post(job["id"], "complete", {"binding": binding, **lease, "result": result}), "complete"
        )
        _step(
            f"worker completed it: job {finished['state']}, task {finished['task_state']}, "
            f"dispatch {finished['dispatch_state']}"
        )
        worker.close()

        shown = _check(alice.get(f"/api/tasks/{task['id']}"), "read task")["task"]
        _step(f"alice sees task {shown['id']} {shown['state']}")
        events = _check(bob.get("/api/audit", params={"job": job["id"]}), "audit")["events"]
        _step(f"{len(events)} audit events for the job, each with its evidence digest")
        verify = _talaria("audit", "verify", "--data-dir", str(data_dir))
        print((verify.stdout or verify.stderr).strip(), flush=True)
        if verify.returncode != 0:
            return 1
        if keep_serving:
            _step(f"the hub keeps serving at {url}; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                hub.wait()
        return 0
    finally:
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)
        with contextlib.suppress(KeyboardInterrupt):
            hub.wait(timeout=30)
        _step(f"hub stopped (exit {hub.returncode})")
