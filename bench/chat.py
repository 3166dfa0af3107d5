"""Chat benchmark (chat.md 10): what the hub adds to a streamed chat turn, and many turns at once.

Set-up: the scripted model server in a child process, streaming every reply as 20 chunks of 20 characters (the
first after 20 ms, then one every 10 ms); for each of two sources, ``local`` and ``lab``, a real ``hermes serve``
(hermes-agent 0.19.0 from ``.venv-hermes``) and a registered ``talaria runner`` process in front of it; a hub
(``HubServer``: uvicorn in a thread of this process, as ``bench/dispatch.py`` runs it; this process does nothing
else while turns are timed); ten accounts. The turns are driven by ``bench/chat_client.py`` in a child process.

After a warm-up turn (direct, and through the hub on each runner), it measures:

- ``direct``: ``--turns`` turns on the ``local`` Hermes' own ``/api/ws``: ``prompt.submit`` to the first non-empty
  ``message.delta`` (first token) and to ``message.complete`` (turn);
- ``hub``: ``--turns`` turns of one conversation on the same Hermes through the hub: ``POST …/turns`` to the first
  ``message.delta`` event of the live stream and to ``turn.completed``. Direct and hub turns alternate, each after
  an untimed 0.1 s pause, and both histories grow alike (one Hermes session, one conversation);
- ``concurrent``: ``--concurrent`` new conversations of ten accounts (bots on both runners), one turn each, all at
  once: how many completed, the wall time, p50/p99 turn time, and ``prompts_once``: each turn's run marker
  ``[talaria-run:<turnId>:<messageId>]`` is in exactly one of the model's requests that offer tools.

Targets: hub first-token p50 <= 1.5 x direct + 0.020 s (``first_token_limit_s``), hub turn p50 <= 1.2 x direct
(``turn_ratio_p50``); ``meets_target`` says whether both hold and never changes the exit status. Progress goes to
stderr, with the hub's own split of its turns (accepted, submit record, end) and each process's CPU seconds per
phase; the last line of stdout is one JSON object. Exit 0 if it ran, 1 if it did not (another Hermes version, a
process that did not start, a turn that did not complete or got another reply, a prompt not seen exactly once).

    .venv/bin/python bench/chat.py [--turns 20] [--concurrent 50]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from talaria.clock import SystemClock
from talaria.hub.runners.registry import parse_registration
from talaria.logs import configure_logging
from talaria.testing.hub_server import HubServer
from talaria.testing.real_hermes import HERMES_VERSION, RealHermes, hermes_python

SOURCES = ("local", "lab")
ACCOUNTS = 10
CHUNKS, CHUNK_CHARS, FIRST_DELAY_S, INTERVAL_S = 20, 20, 0.020, 0.010
REPLY = "".join(f"[chunk {i:02d} of twenty]" for i in range(CHUNKS))  # 20 x 20 characters, no blank at either end
FIRST_TOKEN_FACTOR, FIRST_TOKEN_SLACK_S, TURN_RATIO = 1.5, 0.020, 1.2
PASSWORD = secrets.token_urlsafe(16)
# Hermes' background memory and skill reviews (two more model calls after every 10th user turn of a session) would
# land on whichever turn comes next, so on a different kind of turn for each session: they are turned off.
QUIET_HERMES = "memory:\n  nudge_interval: 0\nskills:\n  creation_nudge_interval: 0\n"
CLIENT = Path(__file__).with_name("chat_client.py")

# The model server in a child process (off the hub's interpreter lock): its base URL on the first line; then, for
# each "log" line on stdin, the chat requests so far as JSON [[offers tools, last user message], ...].
assert len(REPLY) == CHUNKS * CHUNK_CHARS
MODEL = f"""
import json, sys
from talaria.testing.model_server import ModelServer, reply, when
step = reply({REPLY!r}, first_byte_delay_s={FIRST_DELAY_S}, chunk_delay_s={INTERVAL_S}, chunk_chars={CHUNK_CHARS})
server = ModelServer([when(None, step)]).start()
print(server.base_url, flush=True)
for line in sys.stdin:
    if line.strip() == "log":
        print(json.dumps([[bool(r.tools), r.last_user] for r in server.chat_requests()]), flush=True)
server.stop()
"""


def progress(text: str) -> None:
    print(f"[chat] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def figures(samples: dict[str, list[float]]) -> dict[str, float]:
    return {"first_token_p50_s": round(percentile(samples["first"], 50), 4),
            "first_token_p99_s": round(percentile(samples["first"], 99), 4),
            "turn_p50_s": round(percentile(samples["turn"], 50), 4),
            "turn_p99_s": round(percentile(samples["turn"], 99), 4)}  # fmt: skip


class Runner:
    """``python -m talaria runner`` for one source, its stderr in a file (no pipe to fill up)."""

    def __init__(self, server: HubServer, source: str, hermes: RealHermes, work: Path) -> None:
        fields = parse_registration({"name": f"{source} node", "source": source, "allowedProfiles": ["default"],
                                     "hermesURL": hermes.url}, default_server_url=server.url)  # fmt: skip
        registration = server.hub.registry.register("default", fields)
        self.id = registration.runner.id
        node = work / f"node-{source}"
        node.mkdir()
        token_file = node / "hermes-token"
        token_file.write_text(hermes.session_token)
        token_file.chmod(0o600)
        config = node / "runner.json"
        config.write_text(json.dumps(registration.config | {"hermesTokenFile": str(token_file)}))
        config.chmod(0o600)
        self.log = node / "runner.stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TALARIA_", "HERMES_"))}
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "talaria", "runner", "--config", str(config)],
                                         stdin=subprocess.DEVNULL, stderr=err, env=env, cwd=node)  # fmt: skip
        deadline = time.monotonic() + 30
        while "runner connected" not in self.log.read_text(errors="replace") or not server.hub.runners.is_connected(
            self.id
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {source} runner did not connect:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def prompts_once(log: list[list[Any]], turns: list[dict[str, Any]]) -> bool:
    """Each turn's run marker in exactly one tool-offering request (Hermes' title requests offer none)."""
    offered = [str(last) for tools, last in log if tools and last is not None]
    for turn in turns:
        if turn.get("turnId") is None:
            return False
        marker = f"[talaria-run:{turn['turnId']}:{turn['triggerMessageId']}]"
        if sum(1 for text in offered if marker in text and turn["text"] in text) != 1:
            return False
    return True


def summary(raw: dict[str, Any], model_log: list[list[Any]], conversations: int, version: str) -> dict[str, Any]:
    direct, hub = figures(raw["direct"]), figures(raw["hub"])
    limit = round(FIRST_TOKEN_FACTOR * direct["first_token_p50_s"] + FIRST_TOKEN_SLACK_S, 4)
    ratio = round(hub["turn_p50_s"] / direct["turn_p50_s"], 3)
    turns = raw["concurrent"]["turns"]
    done = [t["turn_s"] for t in turns if t["state"] == "completed"]
    wall = raw["concurrent"]["wall_s"]
    return {
        "hermes_version": version,
        "turns": len(raw["hub"]["turn"]),
        "direct": direct,
        "hub": hub,
        "first_token_limit_s": limit,
        "turn_ratio_p50": ratio,
        "concurrent": {
            "conversations": conversations,
            "runners": len(SOURCES),
            "completed": len(done),
            "wall_s": round(wall, 3) if wall is not None else None,
            "turn_p50_s": round(percentile(done, 50), 4) if done else None,
            "turn_p99_s": round(percentile(done, 99), 4) if done else None,
            "prompts_once": prompts_once(model_log, turns),
        },
        "meets_target": hub["first_token_p50_s"] <= limit and ratio <= TURN_RATIO,
    }


def cpu_s(pid: int, group: bool) -> float:
    """CPU seconds (user + system) of ``pid``, or of every process in its process group (Hermes' children, with the
    time of those that ended and were waited for, so that the sum never goes down)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir() if group else [Path(f"/proc/{pid}")]:
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if not group:
            total += int(fields[11]) + int(fields[12])  # utime, stime
        elif int(fields[2]) == pid:  # the process group
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / ticks


def drive(config: dict[str, Any], processes: dict[str, tuple[int, bool]], turns: int) -> dict[str, Any] | None:
    """Run the measuring client; at each of its phase lines read the processes' CPU time, and print, per phase,
    how much each used. Its raw samples, or None if it failed."""
    client = subprocess.Popen([sys.executable, str(CLIENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    processes = processes | {"measuring client": (client.pid, False)}
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write(json.dumps(config) + "\n")
    client.stdin.close()
    marks: list[tuple[str, float, dict[str, float]]] = []
    last = ""
    for line in client.stdout:
        if line.startswith("phase "):
            marks.append((line.split()[1], time.monotonic(), {n: cpu_s(pid, g) for n, (pid, g) in processes.items()}))
        elif line.strip():
            last = line
    if client.wait() != 0 or not last:
        progress(f"the measuring client failed (exit {client.returncode})")
        return None
    for (name, at, before), (_, until, after) in itertools.pairwise(marks):
        if name == "setup":  # closing streams, making the concurrent phase's bots and conversations
            continue
        used = ", ".join(f"{n} {after[n] - before[n]:.1f}" for n in processes)
        per_turn = ""
        if name == "sequential":
            hub = after["hub (this process)"] - before["hub (this process)"]
            runner = after[f"runner {SOURCES[0]}"] - before[f"runner {SOURCES[0]}"]
            per_turn = f"; per hub turn: hub {1000 * hub / turns:.0f} ms, runner {1000 * runner / turns:.0f} ms"
        progress(f"CPU seconds in the {name} phase ({until - at:.1f} s on {os.cpu_count()} cores): {used}{per_turn}")
    result: dict[str, Any] = json.loads(last)
    return result


def hermes_version() -> str:
    """The version of hermes-agent installed beside the ``hermes`` executable (this benchmark is defined for 0.19.0)."""
    code = "import importlib.metadata as m; print(m.version('hermes-agent'))"
    done = subprocess.run([str(hermes_python()), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20, help="sequential turns, direct and through the hub")
    parser.add_argument("--concurrent", type=int, default=50, help="conversations with one turn each, at once")
    args = parser.parse_args()
    if args.turns < 1 or args.concurrent < 1:
        parser.error("--turns and --concurrent must be at least 1")
    configure_logging("WARNING")
    installed = hermes_version()
    if installed != HERMES_VERSION:
        progress(f"hermes-agent {installed} is installed; this benchmark is defined for {HERMES_VERSION}")
        return 1
    with tempfile.TemporaryDirectory(prefix="talaria-chat-") as tmp:
        work = Path(tmp)
        model = subprocess.Popen([sys.executable, "-c", textwrap.dedent(MODEL)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        hermes: dict[str, RealHermes] = {}
        runners: list[Runner] = []
        server: HubServer | None = None
        try:
            assert model.stdin is not None and model.stdout is not None
            model_url = model.stdout.readline().strip()
            progress(f"model server at {model_url}; starting hermes serve {HERMES_VERSION} for {', '.join(SOURCES)}")
            hermes = {source: RealHermes(work / f"hermes-{source}", model_url, config_extra=QUIET_HERMES)
                      for source in SOURCES}  # fmt: skip
            with ThreadPoolExecutor(len(SOURCES)) as pool:
                list(pool.map(RealHermes.start, hermes.values()))
            server = HubServer(work / "data", SystemClock()).start()
            accounts = [f"user{index:02d}" for index in range(min(ACCOUNTS, args.concurrent))]
            for name in accounts:
                server.hub.accounts.create(username=name, password=PASSWORD, role="user",
                                           allowed_profiles={source: ["default"] for source in SOURCES})  # fmt: skip
            for source in SOURCES:
                runners.append(Runner(server, source, hermes[source], work))
            progress(f"hub at {server.url}; {len(runners)} runners connected; {len(accounts)} accounts")
            config = {"hub_url": server.url, "password": PASSWORD, "accounts": accounts, "sources": list(SOURCES),
                      "hermes_url": hermes[SOURCES[0]].url, "hermes_token": hermes[SOURCES[0]].session_token,
                      "turns": args.turns, "concurrent": args.concurrent, "reply": REPLY}  # fmt: skip
            processes = {f"hermes {source}": (h.process.pid if h.process else 0, True) for source, h in hermes.items()}
            processes |= {f"runner {source}": (r.proc.pid, False) for source, r in zip(SOURCES, runners, strict=True)}
            processes |= {"hub (this process)": (os.getpid(), False), "model server": (model.pid, False)}
            raw = drive(config, processes, args.turns)
            if raw is None:
                return 1
            model.stdin.write("log\n")
            model.stdin.flush()
            model_log = json.loads(model.stdout.readline())
        finally:
            for runner in runners:
                runner.stop()
            if server is not None:
                server.stop()
            for process in hermes.values():
                process.stop()
            if model.stdin is not None:
                model.stdin.close()
            model.wait(15)
    result = summary(raw, model_log, args.concurrent, installed)
    print(json.dumps(result), flush=True)
    concurrent = result["concurrent"]
    return 0 if concurrent["completed"] == args.concurrent and concurrent["prompts_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
