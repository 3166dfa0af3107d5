"""Team tools benchmark (team-tools.md 14): what a team tool call costs a Hermes turn, and a four-member goal end to
end, through a real ``hermes serve`` (hermes-agent 0.19.0), a ``talaria runner`` process and a hub on this machine.

Set-up: the scripted model server (a thread of this process), one real Hermes, one runner for source ``local``, a
hub (``HubServer``, uvicorn in a thread of this process) with ``dispatcher.per_runner`` 4, and ``alice`` with
``canManageTeam`` and her bot ``Lead`` with team permission.

- **Round trip.** One coordinator turn makes one bot, then alternates ``--calls`` calls (default 30, at most 88) of
  Hermes' built-in ``todo {}`` (the no-op baseline), ``talaria_list_bots`` (a read) and ``talaria_update_bot`` with
  fresh ``requestId`` s (a write). A sample is, at the model server, from the end of the response carrying the call
  to the arrival of the request carrying its result. ``noop_ms``, ``read_ms``, ``write_ms`` (``{p50, p95}``),
  ``ratio_read_p50``, ``ratio_write_p50``, ``extra_read_p50_ms``, ``extra_write_p50_ms``; targets: extra read
  <= 25 ms, extra write <= 40 ms.
- **Four-member goal.** One user turn creates 4 members, a team, a goal and one assignment each; the members answer
  at once; the review wake accepts all four and finishes. ``goal4``: ``e2e_s`` (user message to the terminal
  message), ``dispatch_s`` (the first assign's response to four jobs ``RUNNING``), ``member_job_p50_s``,
  ``max_parallel_jobs``, ``review_delivery_ms`` (last settle to the review message), ``terminal_delivery_ms`` (the
  goal's end to the terminal message), ``hermes_s`` (Hermes' own time on the goal's path: how long at least one
  of its chat turns, from submit record to end, or a member job, from start to end with its session's creation,
  was in Hermes), ``overhead_s`` = ``e2e_s`` - ``hermes_s``: the time nothing of the goal was in Hermes, what
  Talaria adds (target <= 3 s). ``model_s`` is the time inside model requests on the path.

Also ``hermes_version``, ``via_runner: true`` and ``meets_target`` (informational: it never changes the exit
status). Progress goes to stderr; the last line of stdout is one JSON object. Exit 0 if it ran, 1 if it did not.

    .venv/bin/python bench/team.py [--calls 30]
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from talaria.clock import SystemClock
from talaria.logs import configure_logging
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import (
    LoggedRequest,
    ModelServer,
    Rule,
    Step,
    ToolSelector,
    from_prompt,
    from_result,
    reply,
    tool_call,
    when,
)
from talaria.testing.real_hermes import HERMES_VERSION, RealHermes

sys.path.insert(0, str(Path(__file__).parent))
from chat import PASSWORD, QUIET_HERMES, Runner, hermes_version

MEMBERS = 4
# team-tools.md 14 allows 120 calls; Hermes 0.19.0 ends a turn at 90 model requests (its agent's iteration limit),
# and the turn needs two besides the timed calls (the bot it updates, the last reply)
MAX_CALLS = 88
EXTRA_READ_MS, EXTRA_WRITE_MS, OVERHEAD_S = 25.0, 40.0, 3.0
ASSIGNMENT = r"(?m)^\[talaria-assignment\]"
REVIEW = r"(?m)^\[talaria-goal-review\]"
KINDS = ("noop", "read", "write")


def progress(text: str) -> None:
    print(f"[team] {text}", file=sys.stderr, flush=True)


def team_tool(name: str, arguments: dict[str, Any]) -> Step:
    return tool_call(ToolSelector("team_", f"talaria_{name}:"), arguments)


def round_trip_rule(calls: int) -> Rule:
    steps = [team_tool("create_bot", {"requestId": "bench-bot", "name": "Bench"})]
    for n in range(calls):
        kind = KINDS[n % 3]
        if kind == "noop":
            steps.append(tool_call("todo", {}))
        elif kind == "read":
            steps.append(team_tool("list_bots", {}))
        else:
            steps.append(team_tool("update_bot", {"requestId": f"bench-u{n}", "botId": from_result(0, "/bot/id"),
                                                  "instructions": f"version {n}"}))  # fmt: skip
    return when(None, *steps, reply("round trip done"), pattern=r"^round trip")


def goal_rules() -> list[Rule]:
    made = [team_tool("create_bot", {"requestId": f"g-bot{n}", "name": f"Member {n}"}) for n in range(MEMBERS)]
    ids = [from_result(n, "/bot/id") for n in range(MEMBERS)]
    goal_id = from_result(MEMBERS + 1, "/goal/id")
    steps = [
        *made,
        team_tool("create_team", {"requestId": "g-team", "name": "Four", "memberIds": ids}),
        team_tool("start_goal", {"requestId": "g-goal", "teamId": from_result(MEMBERS, "/team/id"),
                                 "title": "Four parts", "objective": "four parts, one each"}),
        *(team_tool("assign", {"requestId": f"g-asg{n}", "goalId": goal_id, "botId": ids[n], "title": f"Part {n}",
                               "brief": f"write part {n}"}) for n in range(MEMBERS)),
    ]  # fmt: skip
    reviews = [
        team_tool("review_assignment", {
            "requestId": f"g-rev{n}", "decision": "accept", "note": "ok",
            "assignmentId": from_prompt(rf"(?m)^assignment (asg_\S+) review attempt \S+ bot \S+: Part {n}$"),
        })
        for n in range(MEMBERS)
    ]  # fmt: skip
    check = {"criterion": 0, "passed": True, "evidence": "four parts"}
    finish = team_tool("finish_goal", {"requestId": "g-fin", "goalId": from_prompt(r"goalId: (\S+)"),
                                       "status": "complete", "result": "four parts", "acceptanceRevision": 1,
                                       "checks": [check]})  # fmt: skip
    return [
        when(None, *steps, reply("started"), pattern=r"^four members"),
        when(None, reply("part written"), pattern=ASSIGNMENT),
        when(None, *reviews, finish, reply("done"), pattern=REVIEW),
    ]


def last_user(request: LoggedRequest) -> str:
    for message in reversed(request.body["messages"]):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def turn_requests(model: ModelServer, pattern: str) -> list[LoggedRequest]:
    return [r for r in model.chat_requests() if r.tools and re.search(pattern, last_user(r))]


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


def send_and_wait(client: httpx.Client, conversation_id: str, text: str, timeout: float = 300) -> dict[str, Any]:
    sent = client.post(f"/api/conversations/{conversation_id}/turns", json={"text": text})
    if sent.status_code != 202:
        raise SystemExit(f"send failed: {sent.status_code} {sent.text}")
    turn_id = sent.json()["turn"]["id"]
    deadline = time.monotonic() + timeout
    while True:
        turn = client.get(f"/api/conversations/{conversation_id}/turns/{turn_id}").json()["turn"]
        if turn["state"] in ("completed", "failed", "interrupted", "uncertain"):
            return dict(turn)
        if time.monotonic() > deadline:
            raise SystemExit(f"the turn {text!r} did not end")
        time.sleep(0.05)


def round_trip(model: ModelServer, client: httpx.Client, conversation_id: str, calls: int) -> dict[str, Any]:
    model.script(round_trip_rule(calls))
    turn = send_and_wait(client, conversation_id, "round trip")
    if turn["state"] != "completed":
        raise SystemExit(f"the round-trip turn ended {turn['state']} {turn['code']}")
    requests = turn_requests(model, r"^round trip")
    if len(requests) != calls + 2:
        raise SystemExit(f"the round-trip turn made {len(requests)} model requests, not {calls + 2}")
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for n in range(calls):
        carrying, answered = requests[n + 1], requests[n + 2]
        assert carrying.ended_at is not None
        samples[KINDS[n % 3]].append((answered.at - carrying.ended_at) * 1000)
    shown = {f"{kind}_ms": quantiles(values) for kind, values in samples.items()}
    noop, read, write = (shown[f"{k}_ms"]["p50"] for k in KINDS)
    return shown | {
        "ratio_read_p50": round(read / noop, 2) if noop else None,
        "ratio_write_p50": round(write / noop, 2) if noop else None,
        "extra_read_p50_ms": round(read - noop, 2),
        "extra_write_p50_ms": round(write - noop, 2),
    }


def rows(path: Path, sql: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def hermes_time(db: Path, conversation_id: str) -> float:
    """Hermes' own seconds on the goal's path (module docstring): how long at least one of the conversation's chat
    turns (submit record to end) or a member job (start to end) was in Hermes. The member jobs start while the
    coordinator's turn still runs, so the intervals are merged, not added."""
    turns = rows(db, f"SELECT submitted_at, finished_at FROM chat_turn WHERE conversation_id = '{conversation_id}'")
    jobs = rows(db, "SELECT started_at, finished_at FROM hermes_job")
    spans = [(t["submitted_at"], t["finished_at"]) for t in turns if t["submitted_at"] and t["finished_at"]]
    spans += [(j["started_at"], j["finished_at"]) for j in jobs]
    total, reach = 0, 0
    for begin, end in sorted(spans):
        start = max(begin, reach)
        if end > start:
            total, reach = total + end - start, end
    return total / 1000


def span(requests: list[LoggedRequest]) -> float:
    return sum((r.ended_at or r.at) - r.at for r in requests)


def four_member_goal(model: ModelServer, client: httpx.Client, conversation_id: str, db: Path) -> dict[str, Any]:
    model.script(*goal_rules())
    started = time.time()
    turn = send_and_wait(client, conversation_id, "four members")
    if turn["state"] != "completed":
        raise SystemExit(f"the goal's turn ended {turn['state']} {turn['code']}")
    deadline = time.monotonic() + 300
    while True:
        listed = client.get(f"/api/conversations/{conversation_id}/messages").json()["messages"]
        system = [
            m for m in listed if m["role"] == "system" and (m["reference"] or {}).get("deliveryKind") == "terminal"
        ]
        if system:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"no terminal message; goal {rows(db, 'SELECT status FROM goal')}")
        time.sleep(0.05)
    terminal = system[0]
    [goal] = rows(db, "SELECT * FROM goal")
    if goal["status"] != "complete":
        raise SystemExit(f"the goal ended {goal['status']}")
    review = rows(db, "SELECT created_at FROM chat_message WHERE role = 'system' ORDER BY created_at LIMIT 1")[0]
    jobs = rows(db, "SELECT enqueued_at, started_at, finished_at FROM hermes_job ORDER BY enqueued_at")
    settled = max(r["settled_at"] for r in rows(db, "SELECT settled_at FROM assignment_run"))
    user_turn = turn_requests(model, r"^four members")
    first_assign = user_turn[MEMBERS + 2]  # its response carries the first assign
    assert first_assign.ended_at is not None
    members = [r for r in turn_requests(model, ASSIGNMENT)]
    wake = turn_requests(model, REVIEW)
    edges = sorted([(j["started_at"], 1) for j in jobs] + [(j["finished_at"], -1) for j in jobs])
    running = peak = 0
    for _, change in edges:
        running += change
        peak = max(peak, running)
    e2e = terminal["createdAt"] / 1000 - started
    in_model = span(user_turn) + max((span([m]) for m in members), default=0.0) + span(wake)
    hermes = hermes_time(db, conversation_id)
    return {
        "e2e_s": round(e2e, 3),
        "dispatch_s": round(max(j["started_at"] for j in jobs) / 1000 - first_assign.ended_at, 3),
        "member_job_p50_s": round(statistics.median((j["finished_at"] - j["enqueued_at"]) / 1000 for j in jobs), 3),
        "max_parallel_jobs": peak,
        "review_delivery_ms": review["created_at"] - settled,
        "terminal_delivery_ms": terminal["createdAt"] - goal["finished_at"],
        "hermes_s": round(hermes, 3),
        "model_s": round(in_model, 3),
        "overhead_s": round(e2e - hermes, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--calls", type=int, default=30, help=f"timed tool calls in the round-trip turn (3-{MAX_CALLS})"
    )
    args = parser.parse_args()
    if not 3 <= args.calls <= MAX_CALLS:
        parser.error(f"--calls must be 3-{MAX_CALLS}")
    configure_logging("WARNING")
    if hermes_version() != HERMES_VERSION:
        progress(f"this benchmark is defined for hermes-agent {HERMES_VERSION}")
        return 1
    with tempfile.TemporaryDirectory(prefix="talaria-team-") as tmp:
        work = Path(tmp)
        model = ModelServer().start()
        hermes = RealHermes(work / "hermes", model.base_url, config_extra=QUIET_HERMES)
        server: HubServer | None = None
        runner: Runner | None = None
        try:
            hermes.start()
            server = HubServer(work / "data", SystemClock(), dispatcher_per_runner=MEMBERS).start()
            server.hub.accounts.create(username="alice", password=PASSWORD, role="user", can_manage_team=True,
                                       allowed_profiles={"local": ["default"]})  # fmt: skip
            runner = Runner(server, "local", hermes, work)
            client = server.client(headers={"Origin": server.url})
            login = client.post("/api/auth/login", json={"username": "alice", "password": PASSWORD})
            client.headers["X-CSRF-Token"] = login.json()["csrfToken"]
            lead = client.post("/api/bots", json={"name": "Lead", "source": "local", "profile": "default",
                                                  "teamPermission": True}).json()["bot"]  # fmt: skip
            conversation = client.post("/api/conversations", json={"botId": lead["id"]}).json()["conversation"]
            progress(
                f"hub at {server.url}, runner connected, Hermes {HERMES_VERSION}; round trip of {args.calls} calls"
            )
            trip = round_trip(model, client, conversation["id"], args.calls)
            progress(f"round trip: {trip}")
            goal_chat = client.post("/api/conversations", json={"botId": lead["id"]}).json()["conversation"]
            goal4 = four_member_goal(model, client, goal_chat["id"], server.settings.sqlite_path)
            progress(f"four-member goal: {goal4}")
            client.close()
        finally:
            if runner is not None:
                runner.stop()
            if server is not None:
                server.stop()
            hermes.stop()
            model.stop()
    meets = (trip["extra_read_p50_ms"] <= EXTRA_READ_MS and trip["extra_write_p50_ms"] <= EXTRA_WRITE_MS
             and goal4["overhead_s"] <= OVERHEAD_S)  # fmt: skip
    print(json.dumps({"hermes_version": HERMES_VERSION, "via_runner": True, "calls": args.calls, **trip,
                      "goal4": goal4, "meets_target": meets}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
