"""The security matrix of the web routes, generated from the hub app's route table (issue 17, part 3): every method of
every route the app serves is named below with its kind, and a route the table has and the matrix does not (or the
reverse) fails. Each route is then sent, with a well-formed dummy id in each path parameter and an empty JSON body,
by someone who must be refused, and must answer the documented refusal with nothing changed in any table:

- no session, a disabled account's, or one from before a password change (``auth_version``): 401
  ``unauthenticated`` from an API route or a part a page's script fetches (``/live``, a transcript), 303 to
  ``/login?next=`` the path from a page;
- a user on an admin route (session, CSRF token and Origin right): 403 ``admin_required`` (a page: the 403 page);
- a write with an empty or wrong CSRF token, or another Origin: 403 ``csrf_failed``.

The session, CSRF and admin checks run before a body is read or an id looked up (web-api.md 2), so the dummy ids
and bodies cannot decide an answer. Another tenant's objects: test_route_matrix_tenants.py and, for chat, the chat
matrix (test_chat_route_matrix.py).

The runner machine API's ops are read from its own table (``machine_api.OPS``) the same way, and each is sent with no
token, a wrong one, an Origin header, a disabled runner's token (403 ``runner_unauthorized``), and, by a connected
runner, every op but the poll (which starts a new state) with the epoch it had before its latest poll state (409
``runner_epoch_changed``).

Both run on one SQLite hub and on two PostgreSQL replicas of one database: there the world (sessions, the disabled
account, the password change, the removed runner, the newer epoch) is made on replica A and every refused request
goes to replica B, which knows it from the database alone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import pytest

from talaria.hub.api.websession import STATE_CHANGING
from talaria.hub.runners import machine_api
from tests.backends import BACKENDS
from tests.conftest import PASSWORD, add_account, login
from tests.integration.front_back_support import FrontBack, front_and_back
from tests.integration.route_matrix_support import MATRIX, dummy, route_table

FOREIGN_ORIGIN = "http://evil.example"


@dataclass
class Runner:
    id: str
    token: str
    instance: str = "11111111-1111-4111-8111-111111111111"

    def headers(self, token: str | None = None, epoch: str | None = None, **more: str) -> dict[str, str]:
        made = {"Authorization": f"Bearer {token if token is not None else self.token}",
                "X-Runner-Instance": self.instance, "X-Runner-Protocol": "1", **more}  # fmt: skip
        if epoch is not None:
            made["X-Runner-Epoch"] = epoch
        return made


@dataclass
class World:
    hubs: FrontBack
    clients: dict[str, httpx.Client]  # on the back hub
    setup: httpx.Client  # anonymous, on the front hub
    node: Runner
    gone: Runner

    def send(self, who: str, method: str, path: str, **headers: str) -> httpx.Response:
        client = self.clients[who]
        body = {"json": {}} if method in STATE_CHANGING else {}
        request = client.build_request(method, path, headers=headers, **body)  # type: ignore[arg-type]
        response = client.send(request, stream=True)
        try:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                response.read()  # an answered stream would be held open: only its status counts then
        finally:
            response.close()
        return response


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    made: list[httpx.Client] = []
    with front_and_back(request, tmp_path_factory.mktemp("matrix")) as hubs:
        try:
            server = hubs.front
            for name, role in (("root", "admin"), ("alice", "user"), ("dora", "user"), ("vic", "user")):
                add_account(server, name, role, allowed_profiles={"local": ["default"]})
            for name in ("root", "alice", "dora", "vic"):
                made.append(login(server, name))  # each closed at the end, even when a later one fails
            root = made[0]
            assert root.patch("/api/admin/accounts/dora", json={"enabled": False}).status_code == 200
            other = login(server, "vic")  # vic's password changed in another session: the first one ends
            try:
                changed = other.post("/api/auth/password", json={"currentPassword": PASSWORD,
                                                                 "newPassword": PASSWORD + " two"})  # fmt: skip
            finally:
                other.close()
            assert changed.status_code == 200, changed.text
            node, gone = (register(root, name, source) for name, source in (("node", "local"), ("gone", "old")))
            assert root.delete(f"/api/admin/runners/{gone.id}").status_code == 200
            clients = {name: hubs.moved(client) for name, client in zip(("root", "alice", "dora", "vic"), made)}
            clients["anonymous"] = hubs.back.client(headers={"Origin": hubs.back.url})
            made += [*clients.values(), setup := server.client()]
            yield World(hubs, clients, setup, node, gone)
        finally:
            for client in made:
                client.close()


def register(root: httpx.Client, name: str, source: str) -> Runner:
    made = root.post("/api/admin/runners", json={"name": name, "source": source, "allowedProfiles": ["default"]})
    assert made.status_code == 201, made.text
    return Runner(made.json()["runner"]["id"], made.json()["token"])


def test_the_matrix_names_every_route_of_the_route_table() -> None:
    table = route_table()
    assert sorted(table - MATRIX.keys()) == [], "a route the matrix does not name: give it a kind above"
    assert sorted(MATRIX.keys() - table) == [], "the matrix names a route the hub does not serve"


REFUSED_CALLERS = ("anonymous", "dora", "vic")
GUARDED = sorted(key for key, kind in MATRIX.items() if kind != "public")


@pytest.mark.parametrize(("method", "path"), GUARDED, ids=[f"{m} {p}" for m, p in GUARDED])
def test_a_guarded_route_refuses_whoever_must_be_refused_and_changes_nothing(
    world: World, method: str, path: str
) -> None:  # fmt: skip
    kind = MATRIX[(method, path)]
    url = dummy(path)
    before = world.hubs.state()
    for who in REFUSED_CALLERS:  # no session, a disabled account's, one from before a password change
        answer = world.send(who, method, url)
        if kind in ("page", "admin_page"):
            assert answer.status_code == 303, (who, answer.status_code)
            assert answer.headers["location"] == f"/login?next={quote(url, safe='')}", who
        else:
            assert (answer.status_code, answer.json()["code"]) == (401, "unauthenticated"), who
    if kind in ("api_admin", "admin_part"):
        answer = world.send("alice", method, url)
        assert (answer.status_code, answer.json()["code"]) == (403, "admin_required")
    elif kind == "admin_page":
        answer = world.send("alice", method, url)
        assert answer.status_code == 403 and "admin_required" in answer.text
    if method in STATE_CHANGING:
        caller = "root" if kind == "api_admin" else "alice"
        token = world.clients[caller].headers["X-CSRF-Token"]
        for headers in ({"X-CSRF-Token": ""}, {"Origin": FOREIGN_ORIGIN}, {"X-CSRF-Token": token[::-1]}):
            answer = world.send(caller, method, url, **headers)
            assert (answer.status_code, answer.json()["code"]) == (403, "csrf_failed"), headers
    assert world.hubs.state() == before


MACHINE_OPS = {"poll": "GET", "admit": "POST", "result": "POST", "event": "POST", "tool": "POST", "goodbye": "POST",
               "rotate": "POST"}  # fmt: skip


def test_the_matrix_names_every_machine_api_op() -> None:
    assert {name: op.method for name, op in machine_api.OPS.items()} == MACHINE_OPS


@pytest.mark.parametrize("op", sorted(MACHINE_OPS))
def test_a_machine_api_op_refuses_a_wrong_caller_and_changes_nothing(world: World, op: str) -> None:
    method = MACHINE_OPS[op]
    anonymous = world.clients["anonymous"]
    # An epoch the node really had: its state on the back hub, then a new state on the front one (another replica).
    stale = reset_poll(world, anonymous)
    assert reset_poll(world, world.setup) != stale
    before = world.hubs.state()

    def send(runner: Runner, headers: dict[str, str], *, origin: bool = False) -> httpx.Response:
        url = f"{machine_api.PREFIX}{runner.id}/{op}"
        body = {"json": {}} if method == "POST" else {}
        request = anonymous.build_request(method, url, headers=headers, **body)  # type: ignore[arg-type]
        if not origin:
            del request.headers["Origin"]  # a runner sends none; the client's default is a browser's
        return anonymous.send(request)

    node, gone = world.node, world.gone
    for runner, headers, origin in (
        (node, {k: v for k, v in node.headers().items() if k != "Authorization"}, False),
        (node, node.headers(token="not-the-token"), False),
        (node, node.headers(token=gone.token), False),
        (node, node.headers(), True),
        (gone, gone.headers(), False),
    ):  # fmt: skip
        answer = send(runner, headers, origin=origin)
        assert (answer.status_code, answer.json()["code"]) == (403, "runner_unauthorized"), (runner.id, origin)
    if op != "poll":  # a connected runner's request with its previous epoch (a poll would start a new state instead)
        answer = send(node, node.headers(epoch=stale))
        assert (answer.status_code, answer.json()["code"]) == (409, "runner_epoch_changed")
    assert world.hubs.state() == before


def reset_poll(world: World, via: httpx.Client) -> str:
    """The node's epoch after a reset poll sent through ``via`` (a new state, answered at once)."""
    headers = world.node.headers(**{"X-Runner-Reset": "1"})
    request = via.build_request("GET", f"{machine_api.PREFIX}{world.node.id}/poll", headers=headers)
    request.headers.pop("Origin", None)
    answer = via.send(request)
    assert answer.status_code == 200, answer.text
    epoch: str = answer.json()["epoch"]
    return epoch
