"""Many runner instances pressing one hub or two replicas at once (issue 17 part 5): runners registered and
connected as raw instances (``Node``), new instances without a client of their own (``Newcomer``), and one pooled
client per hub that the threads of ``at_once`` share."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from talaria.testing.hub_server import HubServer
from tests.integration.front_back_support import FrontBack
from tests.integration.runner_support import MACHINE, Machine, assert_machine_ok, register

THREADS = 24
T = TypeVar("T")


class Speaker(Protocol):
    """Who a machine request is from: a runner instance (``Machine`` or ``Newcomer``)."""

    runner_id: str

    def headers(self, extra: dict[str, str | None] | None = None) -> dict[str, str]: ...


@dataclass
class Newcomer:
    """A new instance of a runner (a process started again), without a client of its own."""

    runner_id: str
    token: str
    instance: str = field(default_factory=lambda: str(uuid.uuid4()))

    def headers(self, extra: dict[str, str | None] | None = None) -> dict[str, str]:
        made = {"Authorization": f"Bearer {self.token}", "X-Runner-Instance": self.instance, "X-Runner-Protocol": "1"}
        return {name: value for name, value in (made | (extra or {})).items() if value is not None}


@dataclass
class Node:
    """A registered runner, connected as one instance (its machine client on each hub, index 0 the front)."""

    id: str
    token: str
    machines: tuple[Machine, Machine]


@dataclass
class Fleet:
    """The runners, and a pooled client per hub that the threads share: each request from a thread of its own on a
    connection of its own, so concurrent requests really are (a client per request would cost more than the hub)."""

    hubs: FrontBack
    nodes: list[Node]
    clients: tuple[httpx.Client, httpx.Client]

    def server(self, i: int) -> HubServer:
        return (self.hubs.front, self.hubs.back)[i % 2]

    def poll(self, i: int, machine: Speaker, reset: bool = False) -> httpx.Response:
        """``GET poll`` as ``machine``'s instance through hub ``i % 2`` (its epoch not adopted)."""
        path = f"{MACHINE}/{machine.runner_id}/poll"
        extra = {"X-Runner-Epoch": None, "X-Runner-Reset": "1" if reset else None}
        return self.clients[i % 2].get(path, headers=machine.headers(extra))

    def post(self, i: int, machine: Speaker, op: str, body: dict[str, Any], epoch: str | None = None) -> httpx.Response:
        """``POST op`` as ``machine``'s instance (with ``epoch``, or its own) through hub ``i % 2``."""
        extra: dict[str, str | None] = {"Content-Type": "application/json"}
        if epoch is not None:
            extra["X-Runner-Epoch"] = epoch
        headers = machine.headers(extra)
        return self.clients[i % 2].post(f"{MACHINE}/{machine.runner_id}/{op}", json=body, headers=headers)


@contextmanager
def fleet_of(hubs: FrontBack, admin: httpx.Client, sources: list[str]) -> Iterator[Fleet]:
    """A runner of each source registered by ``admin`` and connected (with team-tools-v1) through the front hub,
    disconnected afterwards (whichever instance is current then: its commands end, its hold returns)."""
    with ExitStack() as stack:
        nodes: list[Node] = []
        for source in sources:
            made = register(admin, name=f"node {source}", source=source)
            front = Machine(hubs.front, made["runner"]["id"], made["token"])
            stack.callback(front.close)
            stack.callback(lambda runner_id: hubs.front.call(hubs.front.hub.runners.disconnect(runner_id, "test over")),
                           front.runner_id)  # fmt: skip
            assert_machine_ok(front.poll(reset=True, features="team-tools-v1"))
            back = Machine(hubs.back, front.runner_id, front.token, front.instance)
            stack.callback(back.close)
            back.epoch = front.epoch
            nodes.append(Node(front.runner_id, front.token, (front, back)))
        pool = httpx.Limits(max_connections=THREADS, max_keepalive_connections=THREADS)
        clients = tuple(stack.enter_context(httpx.Client(base_url=hub.url, limits=pool, timeout=40))
                        for hub in (hubs.front, hubs.back))  # fmt: skip
        yield Fleet(hubs, nodes, (clients[0], clients[1]))


def at_once(calls: list[Callable[[], T]]) -> list[T]:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda one: one(), calls))


def codes(answers: list[httpx.Response]) -> Counter[tuple[int, str]]:
    """How many answers of each (status, code); a success's code is ``""``."""
    return Counter((answer.status_code, "" if answer.is_success else answer.json()["code"]) for answer in answers)
