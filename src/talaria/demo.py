"""``talaria demo``: the product end to end on the embedded default, with real processes.

Starts ``talaria hub`` (Runtime API on, a per-run proxy secret) on a fresh data directory, creates
an author and an approver with ``talaria admin create-user``, writes, submits and approves a task
through the JSON API, runs its job to completion with a signed Runtime API worker, registers an
execution node and starts ``talaria runner`` against a real ``hermes serve`` (hermes-agent 0.19.0 from
``.venv-hermes``, a private home with Talaria's plugin, the scripted model server) or, when Hermes is not
installed, Talaria's Hermes protocol fixture (and says which), routes one command and one streamed
test turn (the ``talaria_whoami`` team tool) through it, runs an approved task of cell ``local`` on the
node through the hub's dispatcher and prints its reply and audit trail, checks the audit chain with
``talaria audit verify``, and leaves the hub serving until Ctrl-C. (The Runtime API worker's task is in
cell ``batch``, which no node serves.)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from talaria.testing.real_hermes import HERMES_VERSION, HermesNotInstalled, RealHermes, hermes_bin
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


Stop = Callable[[], None]


def _popen_stop(process: subprocess.Popen[str]) -> Stop:
    return lambda: _stop(process)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _hermes(data_dir: Path, stops: list[Stop]) -> tuple[str, str, str]:
    """Start the Hermes the node runs against: a real ``hermes serve`` with the scripted model when
    hermes-agent is installed (``.venv-hermes``), else Talaria's protocol fixture. Returns
    ``(hermes_url, session_token, what)``."""
    try:
        hermes_bin()
    except HermesNotInstalled as exc:
        _step(f"real Hermes is not available ({exc})")
        fixture = subprocess.Popen(
            [sys.executable, "-m", "talaria.testing.fixture_process"], stdout=subprocess.PIPE, text=True
        )
        stops.append(_popen_stop(fixture))
        assert fixture.stdout is not None
        url, token = fixture.stdout.readline().split()
        return url, token, "Talaria's Hermes protocol fixture (the fallback: replies echo the prompt)"
    model = subprocess.Popen(
        [sys.executable, "-m", "talaria", "testing", "model-server", "--demo"], stdout=subprocess.PIPE, text=True
    )
    stops.append(_popen_stop(model))
    assert model.stdout is not None
    model_url = model.stdout.readline().strip().split(": ", 1)[1]
    _step(f"scripted model server (OpenAI-compatible) at {model_url}")
    hermes = RealHermes(data_dir / "hermes", model_url)
    stops.append(hermes.stop)
    started = time.perf_counter()
    hermes.start()
    _step(
        f"hermes serve (hermes-agent {HERMES_VERSION}) ready in {time.perf_counter() - started:.1f} s at {hermes.url}, "
        f"private home {hermes.home}, Talaria's plugin installed and enabled"
    )
    return hermes.url, hermes.session_token, f"real hermes-agent {HERMES_VERSION} with the scripted model"


def _execution_node(admin: httpx.Client, user: httpx.Client, data_dir: Path, stops: list[Stop]) -> bool:
    """Start Hermes, register a runner, start it, route one command and run one streamed turn through it; whether
    the Hermes is the real one. Whatever it starts goes onto ``stops`` (stopped in reverse order), even when a step
    fails."""
    hermes_url, hermes_token, what = _hermes(data_dir, stops)
    registered = _check(
        admin.post("/api/admin/runners", json={"name": "demo node", "source": "local", "allowedProfiles": ["default"],
                                               "hermesURL": hermes_url}),
        "register a runner",
    )  # fmt: skip
    runner_id = registered["runner"]["id"]
    _step(f"bob registered execution node {runner_id} for source local (the token is shown once)")
    node = data_dir / "node"
    node.mkdir(mode=0o700)
    token_file = node / "hermes-token"
    _write_private(token_file, hermes_token + "\n")
    path = node / "runner.json"
    _write_private(path, json.dumps(registered["config"] | {"hermesTokenFile": str(token_file)}, indent=2))
    _step(f"wrote {path} and {token_file} (mode 600); Hermes here is {what}")
    runner = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "talaria", "runner", "--config", str(path)], stderr=subprocess.PIPE, text=True
    )
    stops.append(_popen_stop(runner))
    assert runner.stderr is not None
    line = runner.stderr.readline().strip()
    _step(f"talaria runner --config {path}: {line}")
    started = time.perf_counter()
    profiles = _check(user.get("/api/sources/local/profiles"), "list profiles")["profiles"]
    elapsed = (time.perf_counter() - started) * 1000
    names = ", ".join(p["name"] for p in profiles)
    _step(f"alice listed the node's Hermes profiles through the runner ({names}) in {elapsed:.1f} ms")
    info = _check(admin.get(f"/api/admin/runners/{runner_id}/hermes"), "describe the node's Hermes")
    tools = info["teamTools"]
    _step(f"the node runs Hermes {info['hermes']['version']}; team tools ready: {tools['ready']} {tools['missing']}")
    prompt = "whoami: who does this conversation act for?"
    _step(f"bob runs a test turn on the node: {prompt!r} (the reply streams below)")
    done: dict[str, Any] = {}
    with admin.stream("POST", f"/api/admin/runners/{runner_id}/test-turn", json={"prompt": prompt},
                      timeout=180) as response:  # fmt: skip
        if response.status_code != 200:
            raise RuntimeError(f"test turn failed: HTTP {response.status_code} {response.read().decode()}")
        print("    ", end="", flush=True)
        event, started_text = "", False
        for raw in response.iter_lines():
            if raw.startswith("event: "):
                event = raw[7:]
            elif raw.startswith("data: "):
                data = json.loads(raw[6:])
                if event == "event" and data.get("type") == "message.delta":
                    text = str(data["payload"].get("text", ""))
                    text = text if started_text else text.lstrip()  # Hermes may open with blank lines
                    started_text = started_text or bool(text)
                    print(text.replace("\n", "\n    "), end="", flush=True)
                elif event in ("done", "error"):
                    done = {"event": event, **data}
        print(flush=True)
    if done.get("event") != "done":
        raise RuntimeError(f"the test turn ended with {done}")
    _step(f"turn {done['status']} (run marker {done['marker']}); the identity above was bound by the hub")
    return what.startswith("real")


def _job_on_the_node(alice: httpx.Client, bob: httpx.Client) -> None:
    """An approved task in cell ``local``: the hub's dispatcher runs its job on the node."""
    body = {"title": "Describe the node", "prompt": "In one line: what is this node for?", "cell": "local",
            "profile": "default"}  # fmt: skip
    task = _check(alice.post("/api/tasks", json=body), "create task")["task"]
    _check(alice.post(f"/api/tasks/{task['id']}/submit"), "submit")
    job = _check(bob.post(f"/api/tasks/{task['id']}/approve"), "approve")["job"]
    _step(f"alice wrote task {task['id']} for cell local; bob approved it: job {job['id']} {job['state']}")
    deadline = time.monotonic() + 120
    while (shown := _check(bob.get(f"/api/jobs/{job['id']}"), "read job")["job"])["terminal"] is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job did not finish: {shown['state']} ({shown['waitingReason']})")
        time.sleep(0.1)
    if shown["state"] != "SUCCEEDED":
        raise RuntimeError(f"the job ended {shown['state']}: {shown['result']}")
    owner = "the hub's dispatcher"
    _step(f"{owner} ran it on the node: job {shown['state']} in attempt {shown['attempt']}; the reply:")
    print("    " + shown["result"]["outputs"]["reply"].replace("\n", "\n    "), flush=True)
    events = _check(bob.get("/api/audit", params={"job": job["id"]}), "audit")["events"]
    ordered = sorted(events, key=lambda e: e["seq"])
    trail = ", ".join(f"{e['type'].removeprefix('hermes.')} by {e['actor']['principal']}" for e in ordered)
    _step(f"audit for the job: {trail}")


def _chat_on_the_node(alice: httpx.Client, url: str) -> str:
    """Alice makes a bot and has a short chat with it on the node, the reply printed as it streams (chat.md 4);
    returns the conversation's page."""
    bot = _check(alice.post("/api/bots", json={"name": "Helper", "source": "local", "profile": "default",
                                               "instructions": "Answer briefly."}), "create bot")["bot"]  # fmt: skip
    conversation = _check(alice.post("/api/conversations", json={"botId": bot["id"]}), "start chat")["conversation"]
    _step(f"alice made bot {bot['name']} ({bot['profile']} on {bot['source']}) and started chat {conversation['id']}")
    for text in ("Hello! What can you do on this node?", "Thanks. One more line, please."):
        sent = _check(alice.post(f"/api/conversations/{conversation['id']}/turns", json={"text": text}), "send")
        turn = sent["turn"]
        _step(f"alice: {text!r} (turn {turn['id']} {turn['state']}; the reply streams below)")
        ended = _stream_reply(alice, conversation["id"], turn["id"])
        if ended["state"] != "completed":
            raise RuntimeError(f"the chat turn ended {ended['state']} {ended['code']}")
    shown = _check(alice.get(f"/api/conversations/{conversation['id']}"), "read chat")["conversation"]
    _step(f"chat {shown['title']!r}: {shown['messageCount']} messages, Hermes session {shown['hermesSessionId']}")
    return f"{url}/chats/{conversation['id']}"


def _team_goal_on_the_node(alice: httpx.Client, url: str) -> None:
    """A bot with team permission forms a team in one chat turn, its member's draft runs as a job on the node, the
    review wake accepts it and finishes the goal, and the report-back reaches the conversation (team-tools.md)."""
    body = {"name": "Lead", "source": "local", "profile": "default", "teamPermission": True}
    lead = _check(alice.post("/api/bots", json=body), "create bot")["bot"]
    conversation = _check(alice.post("/api/conversations", json={"botId": lead["id"]}), "start chat")["conversation"]
    _step(f"alice made bot {lead['name']} with team permission and asked it for a launch note")
    text = "Write the launch note with your team."
    turn = _check(alice.post(f"/api/conversations/{conversation['id']}/turns", json={"text": text}), "send")["turn"]
    ended = _stream_reply(alice, conversation["id"], turn["id"])
    if ended["state"] != "completed":
        raise RuntimeError(f"the team turn ended {ended['state']} {ended['code']}")
    deadline = time.monotonic() + 180
    while True:
        goals = _check(alice.get("/api/goals"), "list goals")["goals"]
        if goals and goals[0]["status"] in ("complete", "blocked", "cancelled"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the team goal did not finish: {goals[0]['status'] if goals else 'not started'}")
        time.sleep(0.2)
    goal = _check(alice.get(f"/api/goals/{goals[0]['id']}"), "read goal")
    team, work = goal["team"], goal["assignments"][0]
    _step(
        f"team {team['name']!r} ({len(team['memberIds'])} members): assignment {work['title']!r} ran as job "
        f"{work['jobId']} on the node, approved by Lead's team permission; goal {goal['goal']['status']}"
    )
    while len(system := [m for m in _check(alice.get(f"/api/conversations/{conversation['id']}/messages"),
                                            "read chat")["messages"] if m["role"] == "system"]) < 2:  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError("the goal's report-back did not arrive")
        time.sleep(0.2)
    for message in sorted(system, key=lambda m: m["createdAt"]):
        _step(f"Talaria in alice's chat: {message['content'].splitlines()[0]}")
    _step(f"the goal's page: {url}/goals/{goal['goal']['id']}")


def _stream_reply(client: httpx.Client, conversation_id: str, turn_id: str) -> dict[str, Any]:
    """Print the turn's ``message.delta`` events from the live stream until its terminal event; returns the turn."""
    ends = ("turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain")
    print("    ", end="", flush=True)
    event, started = "", False
    with client.stream("GET", f"/api/conversations/{conversation_id}/events", params={"after": "0"},
                       timeout=180) as response:  # fmt: skip
        if response.status_code != 200:
            raise RuntimeError(f"the live stream failed: HTTP {response.status_code}")
        for raw in response.iter_lines():
            if raw.startswith("event: "):
                event = raw[7:]
            elif raw.startswith("data: "):
                data = json.loads(raw[6:])
                if event == "message.delta" and data["turnId"] == turn_id:
                    text = str(data["text"]) if started else str(data["text"]).lstrip()  # Hermes may open blank
                    started = started or bool(text)
                    print(text.replace("\n", "\n    "), end="", flush=True)
                elif event in ends and data["turn"]["id"] == turn_id:
                    print(flush=True)
                    ended: dict[str, Any] = data["turn"]
                    return ended
    raise RuntimeError("the live stream ended before the turn did")


def run_demo(*, keep_serving: bool = True, port: int = 0, keep: bool = False) -> int:
    """The demo on a new temporary data directory, removed at the end (Ctrl-C included) unless ``keep``: it holds
    the demo passwords, the hub's ``secret.key`` and a runner token."""
    data_dir = Path(tempfile.mkdtemp(prefix="talaria-demo-"))
    try:
        return _run_demo(data_dir, keep_serving=keep_serving, port=port)
    finally:
        if keep:
            _step(
                f"kept the data directory {data_dir}: it holds the demo passwords, secret.key, audit.key and a "
                "runner token"
            )
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
            _step(
                f"removed the data directory {data_dir} (demo passwords, secret.key, audit.key, runner token); "
                "--keep keeps it"
            )


def _run_demo(data_dir: Path, *, keep_serving: bool, port: int) -> int:
    secret = secrets.token_urlsafe(32)
    _step(f"data directory {data_dir} (SQLite, WAL, synchronous=FULL; removed at the end unless --keep)")
    passwords = {"alice": secrets.token_urlsafe(12), "bob": secrets.token_urlsafe(12)}
    for username, role in (("alice", "user"), ("bob", "admin")):
        done = _talaria(
            "admin", "create-user", "--data-dir", str(data_dir), "--username", username, "--role", role,
            "--allow", "local:default", "--allow", "batch:default", *(["--team"] if username == "alice" else []),
            stdin=passwords[username] + "\n",
        )  # fmt: skip
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        _step(done.stdout.strip())
    secrets_file = data_dir / "demo-passwords.txt"
    secrets_file.write_text("".join(f"{u} {p}\n" for u, p in passwords.items()))
    secrets_file.chmod(0o600)
    _step(f"demo passwords are in {secrets_file} (mode 600)")

    stops: list[Stop] = []
    hub, url = _start_hub(data_dir, port, secret)
    _step(f"hub listening on {url} with the internal Runtime API on (loopback only, signed proxy identity)")
    try:
        alice, bob = _login(url, "alice", passwords["alice"]), _login(url, "bob", passwords["bob"])
        task = _check(
            alice.post("/api/tasks", json={"title": "Summarise the release notes", "prompt": "Summarise them.",
                                           "cell": "batch", "profile": "default"}),
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
        listed = _check(worker.discover("batch", "default"), "discover")["jobs"]
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
        real = _execution_node(bob, alice, data_dir, stops)
        _job_on_the_node(alice, bob)
        chat_page = _chat_on_the_node(alice, url)
        if real:
            _team_goal_on_the_node(alice, url)
        else:
            _step("the team goal needs a real Hermes (a model that calls the tools): skipped")
        verify = _talaria("audit", "verify", "--data-dir", str(data_dir))
        print((verify.stdout or verify.stderr).strip(), flush=True)
        if verify.returncode != 0:
            return 1
        _step(f"web UI: {url}/login (sign in as bob, an admin, with the password in the file above)")
        _step(f"continue alice's chat at {chat_page} (sign in as alice)")
        if keep_serving:
            _step(f"the hub keeps serving at {url}; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                hub.wait()
        return 0
    finally:
        for stop in reversed(stops):
            stop()
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)
        with contextlib.suppress(KeyboardInterrupt):
            hub.wait(timeout=30)
        _step(f"hub stopped (exit {hub.returncode})")
