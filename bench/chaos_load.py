"""The work and the faults of ``bench/chaos.py``: jobs, chat turns and Hermes probes through the hub's JSON API, each
retried the way a careful client would (a request whose answer was lost is looked up before it is sent again, a
chat turn is sent again with its ``Idempotency-Key``); faults injected at random; stale writes tried on purpose.

Every outcome is recorded, never asserted here: ``bench/chaos.py`` judges them.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from chaos_world import GOAL_TEXT, PROXY_SECRET, Runner, World, progress
from talaria.testing.runtime_client import RuntimeClient

CONNECT_RETRY_S = 0.2
API_PATIENCE_S = 180.0  # how long one API call is retried while the hub is down or restarting
TERMINAL_JOB = ("SUCCEEDED", "FAILED", "CANCELLED")
TERMINAL_TURN = ("completed", "failed", "interrupted", "uncertain")
GOAL_ENDED = ("complete", "blocked", "waiting", "cancelled")  # team-tools.md 3.3: what a person acts on, or final
GOAL_QUIET_S = 5.0  # a goal in review with no live turn this long waits for its coordinator (or a person)
RETRIED_CODES = ("hub_draining", "store_unavailable", "hub_starting")
BEFORE = {"PENDING_APPROVAL": ("DRAFT",), "DISPATCHED": ("DRAFT", "PENDING_APPROVAL")}  # states a task leaves
# The refusals a stale write must get: the killed instance's (runner-protocol.md 5.1) and an expired lease's.
STALE_REFUSALS = {"epoch": {"runner_instance_changed", "runner_epoch_changed"}, "lease": {"stale_lease"}}


class Ambiguous(Exception):
    """The request may or may not have been applied: its answer was lost."""


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One API request, sent again while the hub cannot be reached or says it is restarting; ``Ambiguous`` when the
    request went out and its answer did not come back."""
    deadline = time.monotonic() + API_PATIENCE_S
    while True:
        try:
            answer = client.request(method, path, **kwargs)
        except httpx.ConnectError:
            pass  # not sent: the hub is down
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteError) as exc:
            if method == "GET":
                pass
            else:
                raise Ambiguous(f"{method} {path}: {type(exc).__name__}") from exc
        else:
            if answer.status_code != 503 or _code(answer) not in RETRIED_CODES:
                return answer
        if time.monotonic() > deadline:
            raise RuntimeError(f"{method} {path}: the hub did not answer for {API_PATIENCE_S:.0f} s")
        time.sleep(CONNECT_RETRY_S)


def _code(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("code", ""))
    except ValueError:
        return ""


@dataclass
class Record:
    """What the load saw, by kind; read by ``bench/chaos.py`` at the end."""

    jobs: dict[str, str] = field(default_factory=dict)  # marker -> job id
    turns: dict[str, tuple[str, str]] = field(default_factory=dict)  # marker -> (conversation id, turn id)
    goals: dict[str, str] = field(default_factory=dict)  # marker -> the lead's conversation id (real Hermes only)
    accepted_missing: list[str] = field(default_factory=list)  # accepted objects the hub later did not know
    probes: Counter[str] = field(default_factory=Counter)  # status or code -> count
    faults: Counter[str] = field(default_factory=Counter)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    stale_attempts: Counter[str] = field(default_factory=Counter)
    stale_accepted: list[str] = field(default_factory=list)
    stale_answers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def recovered(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.recovery_s.setdefault(kind, []).append(seconds)


class Load:
    def __init__(self, world: World, record: Record, *, seed: int) -> None:
        self.world = world
        self.record = record
        self.rng = random.Random(seed)
        self.alice = world.client("alice")
        self.root = world.client("root")
        self.stop = threading.Event()

    # --- jobs -------------------------------------------------------------------------------------------------

    def job(self, marker: str, cell: str) -> None:
        """Write, submit and approve one task; wait for its job to end (the recovery window is the caller's)."""
        task = self._create_task(marker, cell)
        self._advance(self.alice, task, "submit", "PENDING_APPROVAL")
        approved = self._advance(self.root, task, "approve", "DISPATCHED")
        job_id = str(approved["jobId"])
        with self.record.lock:
            self.record.jobs[marker] = job_id
        while not self.stop.is_set():
            answer = call(self.root, "GET", f"/api/jobs/{job_id}")
            if answer.status_code == 404:
                self._missing(f"job {job_id} ({marker})")
                return
            if answer.json()["job"]["state"] in TERMINAL_JOB:
                return
            time.sleep(0.2)

    def _create_task(self, marker: str, cell: str) -> str:
        body = {"title": marker, "prompt": f"chaos job {marker}", "cell": cell, "profile": "default"}
        while True:
            try:
                answer = call(self.alice, "POST", "/api/tasks", json=body)
            except Ambiguous:
                found = self._task_titled(marker)
                if found is not None:
                    return found
                continue
            if answer.status_code != 201:
                raise RuntimeError(f"POST /api/tasks answered {answer.status_code}: {answer.text[:200]}")
            return str(answer.json()["task"]["id"])

    def _task_titled(self, title: str) -> str | None:
        for task in call(self.alice, "GET", "/api/tasks", params={"limit": 100}).json()["tasks"]:
            if task["title"] == title:
                return str(task["id"])
        return None

    def _advance(self, client: httpx.Client, task_id: str, op: str, state: str) -> dict[str, Any]:
        """POST the task's ``op`` until the task is in ``state`` or past it; a lost answer or a 409 is settled by
        reading the task (an approved task may even have finished by then)."""
        while not self.stop.is_set():
            try:
                answer = call(client, "POST", f"/api/tasks/{task_id}/{op}")
                if answer.status_code == 200:
                    return dict(answer.json()["task"])
                if answer.status_code != 409:
                    raise RuntimeError(f"{op} answered {answer.status_code}: {answer.text[:200]}")
            except Ambiguous:
                pass
            read = call(client, "GET", f"/api/tasks/{task_id}")
            if read.status_code == 404:
                self._missing(f"task {task_id}")
                raise RuntimeError(f"task {task_id} was accepted and is gone")
            task = dict(read.json()["task"])
            if task["state"] not in BEFORE[state]:
                return task
            time.sleep(CONNECT_RETRY_S)
        raise RuntimeError(f"task {task_id}: stopped before {op} was settled")

    def _missing(self, what: str) -> None:
        with self.record.lock:
            self.record.accepted_missing.append(what)

    # --- chat -------------------------------------------------------------------------------------------------

    def conversation(self, source: str) -> str:
        bot = call(self.alice, "POST", "/api/bots", json={"name": f"Chaos {source} {uuid.uuid4().hex[:6]}",
                                                         "source": source, "profile": "default"})  # fmt: skip
        if bot.status_code != 201:
            raise RuntimeError(f"POST /api/bots answered {bot.status_code}: {bot.text[:200]}")
        made = call(self.alice, "POST", "/api/conversations", json={"botId": bot.json()["bot"]["id"]})
        if made.status_code != 201:
            raise RuntimeError(f"POST /api/conversations answered {made.status_code}: {made.text[:200]}")
        return str(made.json()["conversation"]["id"])

    def turn(self, conversation_id: str, marker: str, text: str = "") -> None:
        """One turn, sent again with its key while its answer is lost or the conversation is busy; then waited for."""
        key = "chaos-" + marker.strip("[]")  # Idempotency-Key: 1-255 of [A-Za-z0-9_:-]
        path = f"/api/conversations/{conversation_id}/turns"
        while True:
            try:
                answer = call(self.alice, "POST", path, json={"text": text or f"chaos turn {marker}"},
                              headers={"Idempotency-Key": key})  # fmt: skip
            except Ambiguous:
                continue
            if answer.status_code == 202:
                break
            if (answer.status_code, _code(answer)) in ((409, "turn_in_progress"), (429, "chat_turn_limit")):
                time.sleep(0.2)  # the previous turn is still ending (a recovering turn after a hub restart)
                continue
            raise RuntimeError(f"POST …/turns answered {answer.status_code}: {answer.text[:200]}")
        turn_id = str(answer.json()["turn"]["id"])
        with self.record.lock:
            self.record.turns[marker] = (conversation_id, turn_id)
        while not self.stop.is_set():
            read = call(self.alice, "GET", f"{path}/{turn_id}")
            if read.status_code == 404:
                self._missing(f"turn {turn_id} ({marker})")
                return
            if read.json()["turn"]["state"] in TERMINAL_TURN:
                return
            time.sleep(0.2)

    # --- team goals (real Hermes: a model that calls the tools) ------------------------------------------------

    def goal(self, marker: str, source: str) -> None:
        """A lead bot with team permission, its conversation, and the one turn that starts a team goal there; then
        wait until the goal has ended, or waits in review with nothing running (the judge classifies it)."""
        name = marker.strip("[]")
        body = {"name": f"Lead {name}", "source": source, "profile": "default", "teamPermission": True}
        lead = self._made("/api/bots", "bots", body, lambda bot: bot["name"] == body["name"])
        conversation = self._made("/api/conversations", "conversations", {"botId": lead},
                                  lambda made: made["bot"]["id"] == lead)  # fmt: skip
        with self.record.lock:
            self.record.goals[marker] = conversation
        self.turn(conversation, marker, text=GOAL_TEXT.format(g=name))
        quiet_since: float | None = None
        while not self.stop.is_set():
            goal = self.goal_of(conversation)
            if goal is None:
                return  # none was started: the lead turn's outcome says why
            live = call(self.alice, "GET", f"/api/conversations/{conversation}").json()["conversation"]["liveTurnId"]
            if live is None and goal["status"] in GOAL_ENDED:
                return  # ended, and the turn that ended it too
            if live is None and goal["status"] == "review":
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > GOAL_QUIET_S:
                    return
            else:
                quiet_since = None
            time.sleep(0.5)

    def goal_of(self, conversation_id: str) -> dict[str, Any] | None:
        """The goal started in this conversation, if any."""
        found = [g for g in self.listed("/api/goals", "goals") if (g.get("origin") or {}).get("conversationId")
                 == conversation_id]  # fmt: skip
        return found[0] if found else None

    def _made(self, path: str, key: str, body: dict[str, Any], mine: Callable[[dict[str, Any]], bool]) -> str:
        """POST ``body`` to create one object; when the answer is lost, find it in the list, or send it again (a
        bot sent again after a lost answer that had made it is refused as a duplicate name: then it is found)."""
        while True:
            try:
                answer = call(self.alice, "POST", path, json=body)
            except Ambiguous:
                answer = None
            if answer is not None and answer.status_code == 201:
                return str(answer.json()[key[:-1]]["id"])
            if answer is not None and (answer.status_code, _code(answer)) != (409, "duplicate_bot_name"):
                raise RuntimeError(f"POST {path} answered {answer.status_code}: {answer.text[:200]}")
            if found := [item for item in self.listed(path, key) if mine(item)]:
                return str(found[0]["id"])

    def listed(self, path: str, key: str) -> list[dict[str, Any]]:
        """Every item of one of alice's paged lists."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params = {"limit": 100} | ({"cursor": cursor} if cursor else {})
            page = call(self.alice, "GET", path, params=params).json()
            items += page[key]
            if not (cursor := page["nextCursor"]):
                return items

    # --- commands ---------------------------------------------------------------------------------------------

    def probe(self, runner: Runner) -> int:
        """One admin Hermes view of a runner (commands through it); returns the HTTP status."""
        try:
            answer = call(self.root, "GET", f"/api/admin/runners/{runner.runner_id}/hermes")
        except RuntimeError:
            with self.record.lock:
                self.record.probes["no_answer"] += 1
            return 0
        outcome = "ok" if answer.status_code == 200 else _code(answer) or str(answer.status_code)
        with self.record.lock:
            self.record.probes[outcome] += 1
        return answer.status_code

    def wait_probe_ok(self, runners: list[Runner], deadline: float) -> bool:
        pending = list(runners)
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending if self.probe(r) != 200]
            if pending:
                time.sleep(0.2)
        return not pending

    # --- stale writes -----------------------------------------------------------------------------------------

    def stale_epoch_writes(self, runner: Runner, instance: str, epoch: str) -> None:
        """Writes of a runner instance that is gone (its instance id and epoch), each of which must be refused."""
        headers = {"Authorization": f"Bearer {runner.token}", "X-Runner-Instance": instance,
                   "X-Runner-Protocol": "1", "X-Runner-Epoch": epoch}  # fmt: skip
        base = f"/api/runner/v1/{runner.runner_id}"
        writes: list[tuple[str, dict[str, Any]]] = [
            ("result", {"id": str(uuid.uuid4()), "result": {"status": 200, "headers": {}, "body": ""}}),
            ("admit", {"id": str(uuid.uuid4())}),
        ]
        with httpx.Client(base_url=self.world.api_url, timeout=30) as machine:  # a runner sends no Origin
            for op, body in writes:
                try:
                    answer = call(machine, "POST", f"{base}/{op}", json=body, headers=headers)
                except (Ambiguous, RuntimeError):
                    continue
                self._stale("epoch", answer, f"{op} with the epoch of a killed runner instance")

    def stale_lease_write(self, client: RuntimeClient) -> bool:
        """A Runtime worker's lease expires and another worker takes the job: the first one's heartbeat and
        complete must be refused, the second's complete accepted. False (nothing counted) when a step could not be
        taken; the caller tries again."""
        marker = f"rt-{uuid.uuid4().hex[:8]}"
        task = self._create_task(marker, "rt")
        self._advance(self.alice, task, "submit", "PENDING_APPROVAL")
        job_id = str(self._advance(self.root, task, "approve", "DISPATCHED")["jobId"])
        first = self._claim(client, job_id, "chaos-w1")
        if first is None:
            return False
        binding, lease = first
        if client.post(job_id, "start", {"binding": binding, **lease}).status_code != 200:
            return False
        deadline = time.monotonic() + 60
        second = None
        while second is None and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(1)
            second = self._claim(client, job_id, "chaos-w2")
        if second is None:
            return False
        for op, body in (("heartbeat", {"progress": {"step": 1}}), ("complete", {"result": _RESULT})):
            try:
                answer = client.post(job_id, op, {"binding": binding, **lease, **body})
            except httpx.HTTPError:
                continue
            self._stale("lease", answer, f"{op} with an expired lease")
        binding2, lease2 = second
        client.post(job_id, "start", {"binding": binding2, **lease2})
        done = client.post(job_id, "complete", {"binding": binding2, **lease2, "result": _RESULT})
        if done.status_code != 200:
            with self.record.lock:
                self.record.errors.append(f"the second worker's complete answered {done.status_code}: {done.text}")
        return True

    def _claim(self, client: RuntimeClient, job_id: str, instance: str) -> tuple[dict[str, str], dict[str, Any]] | None:
        try:
            listed = client.discover("rt", "default")
            jobs = [j for j in listed.json().get("jobs", []) if j["binding"]["job"] == job_id]
            if listed.status_code != 200 or not jobs:
                return None
            binding = client.binding(jobs[0])
            claim = client.post(job_id, "claim", {"binding": binding, "worker_instance": instance})
        except httpx.HTTPError:
            return None
        if claim.status_code != 200:
            return None
        held = claim.json()["lease"]
        return binding, {"lease_id": held["lease_id"], "lease_epoch": held["lease_epoch"]}

    def _stale(self, kind: str, answer: httpx.Response, what: str) -> None:
        """Count a stale write: accepted (below 400), or refused otherwise than with its documented 409 (an
        error: it may have been refused for another reason before the epoch or lease was even looked at)."""
        code = _code(answer)
        with self.record.lock:
            self.record.stale_attempts[kind] += 1
            self.record.stale_answers[f"{answer.status_code} {code}"] += 1
            if answer.status_code < 400:
                self.record.stale_accepted.append(f"{what}: {answer.status_code} {answer.text[:200]}")
            elif answer.status_code != 409 or code not in STALE_REFUSALS[kind]:
                self.record.errors.append(f"{what}: refused with {answer.status_code} {code}, not a stale 409")

    def runtime_client(self) -> RuntimeClient:
        return RuntimeClient(self.world.api_url, PROXY_SECRET, principal="chaos-worker", roles="runtime")

    # --- faults -----------------------------------------------------------------------------------------------

    def inject(self, kind: str, inject: Callable[[], None]) -> str:
        with self.record.lock:
            self.record.faults[kind] += 1
        progress(f"fault: {kind}")
        try:
            inject()
        except Exception as exc:
            with self.record.lock:
                self.record.errors.append(f"fault {kind}: {exc!r}")
        return kind

    def fault_by_name(self, kind: str) -> str:
        table = {"hub_kill": self._kill_hub, "runner_kill": self._kill_runner, "reset": self._reset,
                 "half_open": self._half_open, "partition": self._partition, "latency": self._latency}  # fmt: skip
        return self.inject(kind, table[kind])

    def _kill_hub(self) -> None:
        """SIGKILL the hub; with replicas, one of them or (one time in three) both at once."""
        hubs = self.world.hubs
        victims = hubs if len(hubs) == 1 or self.rng.random() < 1 / 3 else [self.rng.choice(hubs)]
        if len(hubs) > 1:
            progress(f"killing {' and '.join(hub.name for hub in victims)}")
        for hub in victims:
            hub.kill()
        time.sleep(self.rng.uniform(0, 2))
        healed = time.monotonic()
        for hub in victims:
            hub.start()
        self._recovered("hub_kill", healed, self.world.runners)

    def _kill_runner(self) -> None:
        runner = self.rng.choice(self.world.runners)
        before = runner.connections()
        runner.kill()
        time.sleep(self.rng.uniform(0, 2))
        healed = time.monotonic()
        runner.start()
        if not runner.wait_connected(len(before), time.monotonic() + 120):
            with self.record.lock:
                self.record.errors.append(f"runner {runner.name} did not connect again")
            return
        self._recovered("runner_kill", healed, [runner])
        if before:
            self.stale_epoch_writes(runner, *before[-1])

    def _reset(self) -> None:
        self.world.proxy.reset_all()
        self._recovered("reset", time.monotonic(), self.world.runners)

    def _half_open(self) -> None:
        self.world.proxy.half_open()
        self._recovered("half_open", time.monotonic(), self.world.runners)

    def _partition(self) -> None:
        self.world.proxy.partition(True)
        time.sleep(self.rng.uniform(2, 12))
        self.world.proxy.partition(False)
        self._recovered("partition", time.monotonic(), self.world.runners)

    def _latency(self) -> None:
        self.world.proxy.set_latency(self.rng.uniform(0.02, 0.2))
        time.sleep(self.rng.uniform(3, 10))
        self.world.proxy.set_latency(0)

    def _recovered(self, kind: str, healed: float, runners: list[Runner]) -> None:
        if self.wait_probe_ok(runners, time.monotonic() + 180):
            self.record.recovered(kind, time.monotonic() - healed)
        else:
            with self.record.lock:
                self.record.errors.append(f"no probe answered within 180 s after {kind}")

    def close(self) -> None:
        self.alice.close()
        self.root.close()


_RESULT = {"outputs": {"reply": "done"}, "artifacts": [], "summary": "done"}
