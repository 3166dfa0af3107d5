"""The runner limits of runner-protocol.md 14 at their edges under concurrent load (issue 17 part 5): several
runners at once, each pressed past its edge, on one SQLite hub and on two PostgreSQL replicas of one database with
the requests alternating between them (the limits are counted under the runner's state row or the grant's row,
scale.md 3.3). Each runner admits exactly up to its edge and refuses the rest with the documented code; what was
admitted is what the runner is given and what runs, once; no runner's load spills into another's.

- pending commands per runner: 64, then 429 ``runner_busy``;
- tool calls per grant: 128 distinct ``callId``s, then 429 ``runner_call_limit`` (a repeat of an admitted one
  answers its first outcome without running again);
- retired instances per runner: 256, then 409 ``runner_instance_limit``.

Open gateway channels and grants per runner (64 / 64) are counted by the runner process itself
(test_runner_gateway.py, tests/unit/test_runner_grant_listener.py); the limits of one runner at a time are
test_runner_transport.py's and test_runner_replicas.py's."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.testing.hub_server import HubServer
from tests.backends import BACKENDS
from tests.integration.front_back_support import front_and_back
from tests.integration.grant_support import ProbeTools, account_ref, call, probe_grant
from tests.integration.machine_load_support import Fleet, Newcomer, Node, at_once, codes, fleet_of
from tests.integration.runner_support import (
    OFF_LIST,
    admin_of,
    assert_machine_ok,
    outcome,
    pending_wire,
    retrieve,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("fast_argon2")

RUNNERS = 4


@pytest.fixture(params=BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    with front_and_back(request, tmp_path) as hubs:
        sources = [f"s{n}" for n in range(RUNNERS)]
        admin = admin_of(hubs.front, allowed_profiles={source: ["default"] for source in sources})
        try:
            with fleet_of(hubs, admin, sources) as made:
                yield made
        finally:
            admin.close()


def started_all(
    server: HubServer, payloads: dict[tuple[int, int], dict[str, str]], nodes: list[Node]
) -> dict[tuple[int, int], asyncio.Task[Any]]:
    """``send`` of each payload (keyed by runner index and number) as tasks started on ``server``'s loop at once."""

    async def start() -> dict[tuple[int, int], asyncio.Task[Any]]:
        loop = asyncio.get_running_loop()
        runners = server.hub.runners
        tasks = {key: loop.create_task(runners.send(nodes[key[0]].id, "http", payload, account=None, profile=None))
                 for key, payload in payloads.items()}  # fmt: skip
        for task in tasks.values():
            task.add_done_callback(retrieve)
        return tasks

    tasks: dict[tuple[int, int], asyncio.Task[Any]] = server.call(start())
    return tasks


def settled(server: HubServer, tasks: dict[tuple[int, int], asyncio.Task[Any]]) -> dict[tuple[int, int], Any]:
    """The outcome of each of ``tasks`` that has ended, read on ``server``'s loop (the exception where it failed)."""

    async def read() -> dict[tuple[int, int], Any]:
        return {key: task.exception() or task.result() for key, task in tasks.items() if task.done()}

    ended: dict[tuple[int, int], Any] = server.call(read())
    return ended


def test_each_runner_queues_exactly_64_commands_the_rest_are_runner_busy_and_the_queued_ones_run_once(
    fleet: Fleet,
) -> None:
    over, top = limits.MAX_PENDING_COMMANDS + 6, limits.MAX_PENDING_COMMANDS
    wanted = {(r, n): dict(OFF_LIST, search=f"?runner={r}&n={n}") for n in range(over) for r in range(RUNNERS)}
    # each runner's command n from hub n % 2: both hubs start all of theirs in one go, at the same moment
    started = at_once([lambda i=i: started_all(fleet.server(i), {key: payload for key, payload in wanted.items()
                                                                   if key[1] % 2 == i}, fleet.nodes)
                       for i in (0, 1)])  # fmt: skip

    def refused() -> dict[tuple[int, int], Any]:  # admitted sends wait for their answers: the ended ones were refused
        return settled(fleet.server(0), started[0]) | settled(fleet.server(1), started[1])

    def placed() -> bool:  # every send is in its runner's queue or refused
        ended = Counter(r for r, _ in refused())
        return all(len(pending_wire(fleet.hubs.front, node.id)) + ended[r] == over
                   for r, node in enumerate(fleet.nodes))  # fmt: skip

    # the sends expire 30 s after they start (the command deadline): placed, delivered and answered well within it
    wait_until(placed, timeout=15, what="every command queued or refused")
    errors = refused()
    assert all(isinstance(error, TalariaError) for error in errors.values()), errors
    for r in range(RUNNERS):
        mine = Counter((e.code, e.status) for (runner, _), e in errors.items() if runner == r)
        assert mine == Counter({("runner_busy", 429): over - top}), (r, mine)
    delivered: list[tuple[Node, dict[str, Any]]] = []
    for r, node in enumerate(fleet.nodes):
        commands: list[dict[str, Any]] = []
        while len(commands) < top:  # a poll with commands queued answers at once
            commands += assert_machine_ok(node.machines[len(commands) % 2].poll())["commands"]
        admitted = [f"?runner={r}&n={n}" for n in range(over) if (r, n) not in errors]
        assert sorted(c["payload"]["search"] for c in commands) == sorted(admitted), "what was queued, once"
        delivered += [(node, command) for command in commands]

    def answer(i: int, node: Node, command: dict[str, Any]) -> httpx.Response:
        return fleet.post(i, node.machines[0], "result", {"id": command["id"], "result": command["payload"]["search"]})

    answers = at_once([lambda i=i, n=n, c=c: answer(i, n, c) for i, (n, c) in enumerate(delivered)])  # fmt: skip
    assert [assert_machine_ok(a) for a in answers] == [{"ok": True}] * len(delivered)
    for (r, n), payload in wanted.items():
        if (r, n) not in errors:
            assert outcome(fleet.server(n), started[n % 2][r, n]) == payload["search"]
    assert all(pending_wire(fleet.hubs.front, node.id) == [] for node in fleet.nodes)


def test_each_grant_runs_exactly_128_distinct_calls_the_rest_are_runner_call_limit_and_repeats_run_nothing(
    fleet: Fleet,
) -> None:
    tools = ProbeTools(fleet.hubs.front, fleet.hubs.back)
    root = account_ref(fleet.hubs.front, "root")
    grants = [probe_grant(fleet.hubs.front, node.machines[1], tools, root) for node in fleet.nodes[:3]]
    top = limits.MAX_TOOL_CALLS_PER_GRANT
    over = top + 12

    def calls() -> list[Callable[[], httpx.Response]]:  # the grants' calls interleaved, each through either hub
        return [
            lambda g=g, n=n: fleet.post(n, fleet.nodes[g].machines[0], "tool",
                                        call(grants[g], f"c{n}", f"probe.g{g}", n=n))
            for n in range(over) for g in range(len(grants))
        ]  # fmt: skip

    first = at_once(calls())
    for g in range(len(grants)):
        mine = first[g :: len(grants)]
        assert codes(mine) == Counter({(200, ""): top, (429, "runner_call_limit"): over - top}), g
        assert sum(1 for _, tool in tools.ran if tool == f"probe.g{g}") == top
    again = at_once(calls())  # every call once more: an admitted one answers its first outcome, runs nothing
    assert [(a.status_code, a.text if a.status_code == 200 else a.json()["code"]) for a in again] == [
        (a.status_code, a.text if a.status_code == 200 else a.json()["code"]) for a in first
    ]
    assert len(tools.ran) == len(grants) * top


def test_each_runner_retires_exactly_256_instances_then_a_new_one_is_runner_instance_limit(fleet: Fleet) -> None:
    over = limits.MAX_RETIRED_INSTANCES + 4
    nodes = fleet.nodes[:3]
    newcomers = [[Newcomer(node.id, node.token) for _ in range(over)] for node in nodes]
    # each runner's newcomers all start at once, the runners' interleaved, through either hub
    answers = at_once([lambda n=n, m=m: fleet.poll(n, m) for n in range(over) for m in (row[n] for row in newcomers)])
    for r, node in enumerate(nodes):
        mine = answers[r :: len(nodes)]
        taken = limits.MAX_RETIRED_INSTANCES
        assert codes(mine) == Counter({(200, ""): taken, (409, "runner_instance_limit"): over - taken}), node.id
        admitted = [m for m, answer in zip(newcomers[r], mine, strict=True) if answer.status_code == 200]
        epochs = {m.instance: answer.json()["epoch"] for m, answer in zip(newcomers[r], mine, strict=True)
                  if answer.status_code == 200}  # fmt: skip
        admits = at_once([lambda n=n, m=m: fleet.post(n, m, "admit", {"id": "x"}, epochs[m.instance])
                          for n, m in enumerate(admitted)])  # fmt: skip
        assert codes(admits) == Counter({(200, ""): 1, (409, "runner_instance_changed"): taken - 1}), (
            "one admitted instance holds the state; each other one was replaced by a later one"
        )
        [survivor] = [m for m, answer in zip(admitted, admits, strict=True) if answer.status_code == 200]
        for retired in (node.machines[0], next(m for m in admitted if m is not survivor)):
            assert fleet.poll(0, retired).json()["code"] == "runner_instance_retired"
        refused = next(m for m, answer in zip(newcomers[r], mine, strict=True) if answer.status_code == 409)
        assert fleet.poll(1, refused, reset=True).json()["code"] == "runner_instance_limit"
        admit = fleet.post(1, survivor, "admit", {"id": "x"}, epochs[survivor.instance])
        assert assert_machine_ok(admit) == {"allowed": False}, "the state was kept"
