"""Chaos benchmark (issue 17): the promises of DESIGN.md 3 under faults.

A controller runs jobs, chat turns and Hermes probes (commands) through a ``talaria hub`` process on SQLite (or,
with ``--postgres``, two hub replicas of one PostgreSQL database the run starts) and three ``talaria runner``
processes, each in front of its own Hermes fixture, while it SIGKILLs and restarts the hub (with replicas: one of
them, or both) and the runners at random, and a loopback proxy between the runners and the hub (with replicas, also
their balancer) injects resets, half-open connections, partitions and latency. Stale writes are tried on purpose: a
killed runner instance's epoch on the machine API, and an expired lease on the Runtime API.

At the end it checks, from the fixtures' own request logs and the runners' command logs:

- ``duplicates``: a prompt that reached Hermes more than once, or a command id a runner started more than once;
- ``silent_losses``: a job or turn not ended after the recovery window, an accepted object the hub later does not
  know, or a job or turn reported done whose prompt never reached Hermes;
- ``misreported``: a turn reported failed before submission whose prompt did reach Hermes;
- ``stale_writes_accepted``: a stale-epoch or stale-lease write answered below 400;
- ``audit_ok``: ``talaria audit verify`` on the data directory (or the database) after the hub stops;
- the hub's data directory (and the PostgreSQL database) and each runner's state directory (its receipts) under the
  sizes stated below.

Progress goes to stderr; the last line of stdout is one JSON object with counts per outcome, the faults injected,
recovery times (p50/p99, from the fault's end until every runner it touched answers a probe), peak RSS of every
process, and ``ok``. The exit status is 0 only when ``ok``.

    .venv/bin/python bench/chaos.py            # >= 1,000 jobs, 200 turns, 10,000 commands; 30 faults (~9 min here)
    .venv/bin/python bench/chaos.py --quick    # >= 250 jobs, 50 turns, 2,500 commands; 12 faults (< 10 min)
    .venv/bin/python bench/chaos.py --smoke    # make chaos-smoke: each fault kind once (~1 min)
    .venv/bin/python bench/chaos.py --postgres # any of the above on two replicas of one PostgreSQL database
    .venv/bin/python bench/chaos.py --real-hermes  # any of the above with runner n1 in front of a real hermes serve

With ``--real-hermes`` a third of the jobs and turns (those of source ``n1``) run in real Hermes 0.19.0 against the
scripted model server; a run is then counted from the model server's log: each model request offering tools whose
last user message ends with the run marker is one run started (Hermes' own side requests, a session title, offer
none), and a run completed when one of its requests ended with a reply. Team goals join the work there: a lead bot
with team permission forms a team, starts a goal and assigns a draft through the team tools (its grant's loopback
listener on ``n1``), the draft runs as a job, the review wake accepts it and finishes the goal. Their jobs and turns
are judged like the others, and every goal must end (complete, blocked, waiting, cancelled) or wait in review for its
coordinator with nothing running (``goals`` in the verdict).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from chaos_load import GOAL_ENDED, TERMINAL_JOB, TERMINAL_TURN, Ambiguous, Load, Record, call
from chaos_world import World, clean_env, progress
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.model_server import SUMMARY_PREFIX, LoggedRequest, ModelServer

MIB = 1024 * 1024
HUB_DATA_LIMIT = 256 * MIB  # the hub's data directory, and the PostgreSQL database
RUNNER_STATE_LIMIT = 32 * MIB
RECOVERY_WINDOW_S = 240.0  # after the last fault: every job and turn must have ended by then
PRE_SUBMISSION = ("runner_offline", "runner_command_not_admitted", "runner_profile_forbidden", "hermes_unavailable",
                  "gateway_rejected", "runner_busy", "runner_payload_limit", "internal_error")  # fmt: skip
# chat.md 3.6: a turn also fails runner_command_uncertain before submission (an open, session or attachment command)
TURN_PRE_SUBMISSION = (*PRE_SUBMISSION, "runner_command_uncertain")
# Each goal makes two bots (the lead and its writer): with the conversations' bots, under chat.md 7's 100 per account.
GOALS_MAX = 40
FAULT_KINDS = ("hub_kill", "runner_kill", "reset", "half_open", "partition", "latency")


@dataclass(frozen=True)
class Size:
    jobs: int
    turns: int
    commands: int
    conversations: int
    job_workers: int
    probe_workers: int
    fault_gap_s: tuple[float, float]  # a random pause in this range between two faults
    stale_leases: int
    fault_rounds: int  # each fault kind this many times; work goes on until the last
    goals: int  # team goals, one after another, in real Hermes (--real-hermes only)


# At most 8 conversations: they are one account's, and chat.md 7 allows 8 turns in progress per account (a goal's
# lead turn, alice's too, then waits for a slot: its 429 is retried).
SIZES = {
    "default": Size(1000, 200, 10_000, 8, 12, 3, (4.0, 12.0), 5, 5, 10),
    "quick": Size(250, 50, 2500, 5, 10, 2, (3.0, 8.0), 3, 2, 4),
    "smoke": Size(24, 9, 150, 3, 6, 1, (1.0, 2.0), 1, 1, 2),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


RUN_MARKER = re.compile(r"^\[talaria-run:([^:\]]+):([^:\]]+)\]$")


@dataclass(frozen=True)
class Executions:
    """How many times Hermes started each run, by the run marker on its prompt's last line (the driver's, on its
    own line: ``[talaria-run:<run id>:<work id>]``). A chat turn's run id is its turn id; a job's work id is its
    job id. Markers elsewhere in a prompt are carried-over transcript (chat.md 5.4), not executions."""

    runs: Counter[str]
    works: Counter[str]
    pairs: list[tuple[str, str]]
    texts: dict[str, list[str]]
    completed: set[str]  # run and work ids of runs Hermes completed (a reply was stored in its history)
    in_real_hermes: int  # of the runs, those started in real Hermes (counted from the model server's log)

    @classmethod
    def of(cls, fixtures: list[HermesFixture], model: ModelServer | None = None) -> Executions:
        """From the fixtures' turn logs and, with real Hermes, the model server's: a request of the agent's own (it
        offers tools; a title request offers none, a compression request is a summary's) whose last message is the
        user's prompt starts a run, and a run completed when any of its requests ended with a reply."""
        started = [(turn.text, turn.status == "complete") for fixture in fixtures for turn in fixture.turns()]
        agent = [r for r in (model.chat_requests() if model else []) if r.tools and not _summary(r)]
        replied = {found[0] for r in agent if r.finish == "stop" and (found := _marker(r.prompt))}
        real = [(r.last_user, bool((found := _marker(r.last_user)) and found[0] in replied))
                for r in agent if r.last_user is not None]  # fmt: skip
        made = cls(Counter(), Counter(), [], {}, set(), sum(1 for text, _ in real if _marker(text)))
        for text, complete in started + real:
            found = _marker(text)
            if found is None:
                continue
            made.runs[found[1]] += 1
            made.works[found[2]] += 1
            made.pairs.append((found[1], found[2]))
            for key in found.groups():
                made.texts.setdefault(key, []).append(f"{'complete' if complete else 'open'} {text[:80]!r}")
            if complete:
                made.completed.update(found.groups())
        return made


def _marker(text: str) -> re.Match[str] | None:
    """The run marker on the prompt's last line (the whole marker, its run and its work), or None."""
    return RUN_MARKER.match(text.rstrip().rsplit("\n", 1)[-1])


def _summary(request: LoggedRequest) -> bool:
    """Hermes' compression request, which may quote the latest prompt, marker and all."""
    messages = request.body.get("messages") or [{}]
    first = messages[0] if isinstance(messages[0], dict) else {}
    return isinstance(first.get("content"), str) and first["content"].startswith(SUMMARY_PREFIX)


class Run:
    def __init__(self, world: World, size: Size, seed: int, smoke: bool) -> None:
        self.world = world
        self.size = size
        self.smoke = smoke
        self.record = Record()
        self.load = Load(world, self.record, seed=seed)
        self.work_done = threading.Event()
        self.work_done_at = 0.0
        self.handed: Counter[str] = Counter()  # jobs and turns handed to workers so far
        self.faults_done = threading.Event()
        self.goal_workers = 1 if world.model is not None and size.goals else 0
        self.goals_made = threading.Event()  # set once no more goals will be started
        if not self.goal_workers:
            self.goals_made.set()
        self.workers = size.job_workers + size.conversations + self.goal_workers

    def go(self) -> None:
        started = time.monotonic()
        runners = len(self.world.runners)
        sources = [r.source for r in self.world.runners]
        conversations = [self.load.conversation(sources[c % runners]) for c in range(self.size.conversations)]
        if self.world.model is not None:  # a fresh hermes serve may fail its first concurrent runs: one run first
            self.load.turn(conversations[0], "[w00000]")
        threads = [threading.Thread(target=self._faults, name="faults", daemon=True),
                   threading.Thread(target=self._stale_leases, name="stale-leases", daemon=True)]  # fmt: skip
        threads += [threading.Thread(target=self._probes, name=f"probes-{k}", daemon=True)
                    for k in range(self.size.probe_workers)]  # fmt: skip
        for thread in threads:
            thread.start()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="work") as pool:
            work = [pool.submit(self._jobs, sources) for _ in range(self.size.job_workers)]
            work += [pool.submit(self._turns, conversation) for conversation in conversations]
            work += [pool.submit(self._goals) for _ in range(self.goal_workers)]
            self._wait(work)
        self.work_done_at = time.monotonic()
        self.work_done.set()
        for thread in threads:
            thread.join()
        progress(f"work ended after {time.monotonic() - started:.0f} s")

    def _more(self, kind: str, quota: int) -> int | None:
        """The next number of ``kind``, while the quota is not reached or faults are still to come (faults always
        meet live work). None once there is no more to do."""
        with self.record.lock:
            n = self.handed[kind]
            self.handed[kind] += 1
        if self.load.stop.is_set() or (n >= quota and self.faults_done.is_set()):
            return None
        return n

    def _made_enough(self) -> bool:
        """The faults have stopped and no more work will be handed out (what was handed out may still be under
        way): the recovery window starts, whether or not the workers have come back from their last items."""
        with self.record.lock:
            handed = self.handed["jobs"] >= self.size.jobs and self.handed["turns"] >= self.size.turns
        return self.faults_done.is_set() and handed and self.goals_made.is_set()

    def _jobs(self, sources: list[str]) -> None:
        while (n := self._more("jobs", self.size.jobs)) is not None:
            self.load.job(f"[j{n:05d}]", sources[n % len(sources)])

    def _turns(self, conversation: str) -> None:
        while (n := self._more("turns", self.size.turns)) is not None:
            self.load.turn(conversation, f"[t{n:05d}]")

    def _goals(self) -> None:
        """Team goals, one after another, by lead bots on ``n1`` (real Hermes): at least ``size.goals``, and on until
        one has started after the last fault (so one runs clean), never more than ``GOALS_MAX``."""
        n, clean = 0, False
        try:
            while not self.load.stop.is_set() and n < GOALS_MAX and (n < self.size.goals or not clean):
                clean = self.faults_done.is_set()
                if (clean and n + 1 >= self.size.goals) or n + 1 >= GOALS_MAX:
                    self.goals_made.set()  # this one is the last
                self.load.goal(f"[g{n:05d}]", self.world.runners[0].source)
                n += 1
        finally:
            self.goals_made.set()

    def _wait(self, work: list[Future[None]]) -> None:
        """Wait for the work; once the faults have stopped and no more work will be handed out, at most
        ``RECOVERY_WINDOW_S`` more (every job and turn then open had that long to end)."""
        deadline: float | None = None
        while not all(f.done() for f in work):
            if deadline is None and self._made_enough():
                deadline = time.monotonic() + RECOVERY_WINDOW_S
            if deadline is not None and time.monotonic() > deadline:
                progress("the recovery window ended with work still open")
                self.load.stop.set()
            time.sleep(0.5)
        for future in work:
            if future.exception() is not None:
                self.record.errors.append(f"work failed: {future.exception()!r}")

    def _faults(self) -> None:
        """Each kind ``fault_rounds`` times: in the order of ``FAULT_KINDS`` for the smoke run, shuffled otherwise."""
        plan = list(FAULT_KINDS) * self.size.fault_rounds
        if not self.smoke:
            self.load.rng.shuffle(plan)
        try:
            while plan and not self.load.stop.wait(self.load.rng.uniform(*self.size.fault_gap_s)):
                self.load.fault_by_name(plan.pop(0))
        finally:
            self.world.proxy.partition(False)
            self.world.proxy.set_latency(0)
            self.faults_done.set()
            progress("faults stopped")

    def _stale_leases(self) -> None:
        client = self.load.runtime_client()
        try:
            done = tries = 0
            while done < self.size.stale_leases and tries < 4 * self.size.stale_leases and not self.load.stop.is_set():
                tries += 1
                try:
                    done += self.load.stale_lease_write(client)
                except (httpx.HTTPError, Ambiguous) as exc:  # the hub went away mid-way: this attempt is void
                    progress(f"stale lease writer: attempt lost ({type(exc).__name__})")
                except Exception as exc:
                    self.record.errors.append(f"stale lease writer: {exc!r}")
        finally:
            client.close()

    def _probes(self) -> None:
        """Probe the runners in turn until the work is done and the runners have started enough commands, or
        the run is stopped, or the work has been done for ``RECOVERY_WINDOW_S`` (the count then falls short,
        which the verdict reports)."""
        k, counted_at, enough = 0, 0.0, False
        while not (self.work_done.is_set() and enough) and not self.load.stop.is_set():
            if self.work_done.is_set() and time.monotonic() - self.work_done_at > RECOVERY_WINDOW_S:
                break
            if self.load.probe(self.world.runners[k % len(self.world.runners)]) != 200:
                self.load.stop.wait(0.05)  # a node down answers at once: no busy loop
            k += 1
            if time.monotonic() - counted_at > 5:  # the logs are read now and then, not per probe
                counted_at, enough = time.monotonic(), self.commands() >= self.size.commands

    def commands(self) -> int:
        return sum(1 for r in self.world.runners for line in r.lines() if line.get("event") == "command_started")


@dataclass
class GoalWork:
    """What the load's team goals came to: goals by status, the jobs and turns they made besides the lead's turn
    (assignment jobs, wakes), keyed like the load's own, the goals left with work open, and user turns in a goal's
    conversation other than its lead's (a replayed request that made a second one)."""

    statuses: Counter[str]
    jobs: dict[str, str]
    turns: dict[str, tuple[str, str]]
    still_open: list[str]
    extra_user_turns: list[str]


def goal_work(load: Load) -> GoalWork:
    """A goal in review with no turn running waits for its coordinator or a person (a wake that failed, a review the
    script could not make): an explicit outcome, counted apart."""
    made = GoalWork(Counter(), {}, {}, [], [])
    for marker, conversation in load.record.goals.items():
        path = f"/api/conversations/{conversation}/turns"
        for turn_id in _turn_ids(load, conversation):
            if load.record.turns.get(marker) == (conversation, turn_id):
                continue
            if call(load.alice, "GET", f"{path}/{turn_id}").json()["turn"]["trigger"] == "automatic":
                made.turns[f"{marker}{turn_id}"] = (conversation, turn_id)
            else:
                made.extra_user_turns.append(f"turn {turn_id} in goal conversation {marker}")
        found = load.goal_of(conversation)
        if found is None:
            made.statuses["not started"] += 1
            continue
        goal = call(load.alice, "GET", f"/api/goals/{found['id']}").json()
        made.jobs |= {f"{marker}{a['id']}": a["jobId"] for a in goal["assignments"] if a.get("jobId")}
        status = goal["goal"]["status"]
        live = call(load.alice, "GET", f"/api/conversations/{conversation}").json()["conversation"]["liveTurnId"]
        if status == "review" and live is None:
            status = "review, awaiting the coordinator"
        elif status not in GOAL_ENDED:  # (a turn still live is the turns' check)
            made.still_open.append(f"goal {found['id']} ({marker}) still {status}")
        made.statuses[status] += 1
    return made


def _turn_ids(load: Load, conversation: str) -> list[str]:
    """Every turn of a conversation, by its messages."""
    messages = load.listed(f"/api/conversations/{conversation}/messages", "messages")
    return list({m["turnId"]: None for m in messages if m.get("turnId")})


def judge(run: Run, fixtures: list[HermesFixture], model: ModelServer | None) -> dict[str, Any]:
    record, load = run.record, run.load
    duplicates, losses, misreported = 0, list(record.accepted_missing), 0
    reply_in_hermes = Counter[str]()  # reported uncertain, yet Hermes completed the run (its reply was there)
    examples: list[str] = []
    ran = Executions.of(fixtures, model)
    goals = goal_work(load)
    losses += goals.still_open
    duplicates += len(goals.extra_user_turns)
    examples += goals.extra_user_turns[:5]
    all_jobs, all_turns = record.jobs | goals.jobs, record.turns | goals.turns
    job_states: Counter[str] = Counter()
    for marker, job_id in all_jobs.items():
        read = call(load.root, "GET", f"/api/jobs/{job_id}")
        if read.status_code == 404:
            losses.append(f"job {job_id} ({marker}) accepted and now unknown")
            continue
        job = read.json()["job"]
        reason = (job.get("terminal") or {}).get("reasonCode") or ""
        job_states[job["state"] + (f" {reason}" if reason and job["state"] != "SUCCEEDED" else "")] += 1
        seen = ran.works[job_id]
        duplicates += max(0, seen - 1)
        if seen > 1:
            examples.append(f"job {marker} {job['state']}: " + " | ".join(ran.texts[job_id])[:600])
        if job["state"] not in TERMINAL_JOB:
            losses.append(f"job {job_id} still {job['state']}")
        elif job["state"] == "SUCCEEDED" and seen == 0:
            losses.append(f"job {job_id} SUCCEEDED without its prompt reaching Hermes")
        elif job["state"] == "FAILED" and reason in PRE_SUBMISSION and seen > 0:
            misreported += 1
        if reason == "runner_command_uncertain" and job_id in ran.completed:
            reply_in_hermes["jobs"] += 1
    turn_states: Counter[str] = Counter()
    for marker, (conversation, turn_id) in all_turns.items():
        read = call(load.alice, "GET", f"/api/conversations/{conversation}/turns/{turn_id}")
        if read.status_code == 404:
            losses.append(f"turn {turn_id} ({marker}) accepted and now unknown")
            continue
        turn = read.json()["turn"]
        code = turn.get("code") or ""
        turn_states[turn["state"] + (f" {code}" if code else "")] += 1
        seen = ran.runs[turn_id]
        duplicates += max(0, seen - 1)
        if seen > 1:
            examples.append(f"turn {marker} {turn['state']}: " + " | ".join(ran.texts[turn_id])[:600])
        if turn["state"] not in TERMINAL_TURN:
            losses.append(f"turn {turn_id} still {turn['state']}")
        elif turn["state"] == "completed" and seen == 0:
            losses.append(f"turn {turn_id} completed without its prompt reaching Hermes")
        elif turn["state"] == "failed" and code in TURN_PRE_SUBMISSION and seen > 0:
            misreported += 1
        if turn["state"] == "uncertain" and turn_id in ran.completed:
            reply_in_hermes["turns"] += 1
    # a run Hermes started for no job or turn the load made: a second object made by a replayed request
    known_turns = {turn_id for _, turn_id in all_turns.values()}
    known_jobs = set(all_jobs.values())
    strays = [f"{run_id}:{work_id}" for run_id, work_id in ran.pairs if run_id not in known_turns
              and work_id not in known_jobs]  # fmt: skip
    started: Counter[str] = Counter()
    for runner in run.world.runners:
        started.update(str(line["command_id"]) for line in runner.lines() if line.get("event") == "command_started")
    twice = {command: n for command, n in started.items() if n > 1}
    duplicates += sum(n - 1 for n in twice.values()) + len(strays)
    examples += [f"command {command} started {n} times" for command, n in list(twice.items())[:5]]
    examples += [f"a Hermes run for nothing the load made: {stray}" for stray in strays[:5]]
    return {
        "jobs": dict(job_states), "turns": dict(turn_states), "goals": dict(goals.statuses),
        "commands": {"executed": len(started), "target": run.size.commands, "probes": dict(record.probes)},
        "runs_in_real_hermes": ran.in_real_hermes, "duplicates": duplicates,
        "silent_losses": len(losses), "misreported": misreported, "losses": losses[:10],
        "uncertain_with_reply_in_hermes": {"jobs": reply_in_hermes["jobs"], "turns": reply_in_hermes["turns"]},
        "duplicate_examples": examples[:10],
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="a smaller run (at most 10 minutes here)")
    which.add_argument("--smoke", action="store_true", help="the CI run: each fault kind once (under 3 minutes)")
    parser.add_argument("--seed", type=int, default=17, help="seed of the fault schedule (default 17)")
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="two hub replicas of one PostgreSQL database (started by the run) instead of SQLite",
    )
    parser.add_argument(
        "--real-hermes",
        action="store_true",
        help="runner n1 in front of a real hermes serve (hermes-agent 0.19.0, make hermes) with the scripted model",
    )
    parser.add_argument("--keep", metavar="DIR", type=Path, help="copy the logs and data directories here at the end")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: the world is closed (real Hermes runs in a process group of its own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "default"]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="talaria-chaos-") as tmp:
        world = World(Path(tmp), args.runners, postgres=args.postgres, real_hermes=args.real_hermes)
        try:
            world.open()
            run = Run(world, size, args.seed, args.smoke)
            run.go()
            fixtures = [r.hermes for r in world.runners if r.hermes is not None]
            verdict = judge(run, fixtures, world.model)
            run.load.close()
            world.stop_hubs()
            verify = subprocess.run(
                [sys.executable, "-m", "talaria", "audit", "verify", "--data-dir", str(world.hub.data)],
                capture_output=True, text=True, env=clean_env(**world.env), timeout=300, check=False,
            )  # fmt: skip
            progress(f"audit verify: {verify.stdout.strip() or verify.stderr.strip()}")
            sizes = world.sizes()
        finally:
            world.close()
            if args.keep is not None:
                shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("hermes-token"))
                progress(f"kept the run's files in {args.keep}")
    record = run.record
    over = [name for name, value in sizes.items()
            if value > (RUNNER_STATE_LIMIT if name.endswith("_state") else HUB_DATA_LIMIT)]  # fmt: skip
    recovery = {kind: {"p50": round(percentile(v, 50), 2), "p99": round(percentile(v, 99), 2), "n": len(v)}
                for kind, v in sorted(record.recovery_s.items())}  # fmt: skip
    processes = [*world.hubs, *world.runners, *world.others]
    rss = {m.name: round(m.peak_kib / 1024, 1) for m in processes}
    rss["controller_and_fixtures"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    summary = (
        {"backend": "postgresql" if args.postgres else "sqlite", "hermes": "real n1" if args.real_hermes else "fixture"}
        | verdict
        | {
            "faults": dict(record.faults) | {f"proxy_{k}": v for k, v in world.proxy.counts.items()},
            "recovery_s": recovery,
            "stale_writes_attempted": dict(record.stale_attempts),
            "stale_writes_accepted": len(record.stale_accepted),
            # model calls whose scripted argument was missing (a tool call a fault cut): that run failed, as intended
            "model_unresolved": len(world.model.unresolved) if world.model is not None else 0,
            "stale_answers": dict(record.stale_answers),
            "audit_ok": verify.returncode == 0,
            "sizes_mib": {name: round(value / MIB, 2) for name, value in sizes.items()},
            "sizes_over_limit": over,
            "peak_rss_mib": rss,
            "restarts": {m.name: m.starts - 1 for m in processes},
            "errors": record.errors[:10],
            "seconds": round(time.monotonic() - began, 1),
        }
    )
    summary["ok"] = (
        summary["duplicates"] == 0 and summary["silent_losses"] == 0 and summary["misreported"] == 0
        and summary["stale_writes_accepted"] == 0 and summary["audit_ok"] and not over and not record.errors
        and record.stale_attempts["epoch"] > 0 and record.stale_attempts["lease"] > 0
        and summary["commands"]["executed"] >= size.commands
    )  # fmt: skip
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
