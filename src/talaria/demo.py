"""``talaria demo``: the product end to end on the embedded default, with real processes.

Starts ``talaria hub`` (Runtime API on, a per-run proxy secret) on a fresh data directory, creates
an author and an approver with ``talaria admin create-user``, writes, submits and approves a task
through the JSON API, runs its job to completion with a signed Runtime API worker, registers an
execution node and starts ``talaria runner`` against Talaria's Hermes protocol fixture, routes one
command through it, checks the audit chain with ``talaria audit verify``, and leaves the hub serving
until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
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


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=15)


def _execution_node(admin: httpx.Client, user: httpx.Client, data_dir: Path) -> list[subprocess.Popen[str]]:
    """Register a runner, start the Hermes fixture and the runner, and route one command through them."""
    registered = _check(
        admin.post("/api/admin/runners", json={"name": "demo node", "source": "local", "allowedProfiles": ["default"]}),
        "register a runner",
    )
    _step(f"bob registered execution node {registered['runner']['id']} for source local (the token is shown once)")
    node = data_dir / "node"
    node.mkdir(mode=0o700)
    fixture = subprocess.Popen(
        [sys.executable, "-m", "talaria.testing.fixture_process"], stdout=subprocess.PIPE, text=True
    )
    assert fixture.stdout is not None
    hermes_url, hermes_token = fixture.stdout.readline().split()
    config = registered["config"] | {"hermesURL": hermes_url}
    path = node / "runner.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(config, handle, indent=2)
    _step(f"wrote {path} (mode 600); Hermes here is Talaria's protocol fixture at {hermes_url}")
    env = dict(os.environ, HERMES_DASHBOARD_SESSION_TOKEN=hermes_token)
    runner = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "talaria", "runner", "--config", str(path)], stderr=subprocess.PIPE, text=True, env=env
    )
    assert runner.stderr is not None
    line = runner.stderr.readline().strip()
    _step(f"talaria runner --config {path}: {line}")
    started = time.perf_counter()
    profiles = _check(user.get("/api/sources/local/profiles"), "list profiles")["profiles"]
    elapsed = (time.perf_counter() - started) * 1000
    names = ", ".join(p["name"] for p in profiles)
    _step(f"alice listed the node's Hermes profiles through the runner ({names}) in {elapsed:.1f} ms")
    return [fixture, runner]


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

    processes: list[subprocess.Popen[str]] = []
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
        processes = _execution_node(bob, alice, data_dir)
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
        for process in reversed(processes):
            _stop(process)
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)
        with contextlib.suppress(KeyboardInterrupt):
            hub.wait(timeout=30)
        _step(f"hub stopped (exit {hub.returncode})")
