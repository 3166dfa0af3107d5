"""The security matrix's "another tenant" column (issue 17, part 3), generated from the same route table as
``test_route_matrix.py``: every guarded route with a path parameter, called by tenant ``default``'s user and admin
with the ids of tenant ``acme``'s objects (a dispatched task and its job, an account, a runner, a source), answers as
an unknown id does, 404 (the 404 page for a page), never 403, and changes nothing: on one SQLite hub, and on two
PostgreSQL replicas (the objects made on one, asked for on the other).

A path parameter the matrix cannot fill with another tenant's object fails, unless it is named in ``ELSEWHERE`` with
the test that covers it, so a route added later joins the matrix or says where it is covered."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from talaria.hub.api.websession import STATE_CHANGING
from talaria.hub.runners.registry import parse_registration
from tests.backends import BACKENDS
from tests.conftest import add_account, login
from tests.integration.front_back_support import FrontBack, front_and_back
from tests.integration.route_matrix_support import MATRIX

ACME = "acme"
# Parameters whose other-tenant (and other-account) case another matrix covers with real objects.
ELSEWHERE = {
    "bot_id": "test_chat_route_matrix.py",
    "conversation_id": "test_chat_route_matrix.py",
    "turn_id": "test_chat_route_matrix.py",
    "message_id": "test_chat_route_matrix.py",
    "attachment_id": "test_chat_route_matrix.py",
    "team_id": "test_team_api.py (another account's team)",
    "goal_id": "test_team_api.py (another account's goal)",
}
# A well-formed body where a route needs one: a malformed body is refused (400) before the object is looked up.
BODIES = {
    ("PATCH", "/api/admin/accounts/{username}"): {"enabled": False},
    ("POST", "/api/tasks/{task_id}/reject"): {"reason": "matrix"},
    ("POST", "/api/tasks/{task_id}/cancel"): {"reason": "matrix"},
    ("POST", "/api/jobs/{job_id}/cancel"): {"reason": "matrix"},
    ("POST", "/api/admin/runners/{runner_id}/test-turn"): {"profile": "default", "prompt": "hello"},
}
WITH_PARAMETERS = sorted(key for key, kind in MATRIX.items() if kind != "public" and "{" in key[1])
FILLED = ("task_id", "job_id", "username", "runner_id", "source")
HERE = [key for key in WITH_PARAMETERS if set(re.findall(r"{(\w+)}", key[1])) <= set(FILLED)]


@dataclass
class World:
    hubs: FrontBack
    alice: httpx.Client  # a user of tenant default (on the back hub)
    root: httpx.Client  # tenant default's admin (on the back hub)
    ids: dict[str, str]  # path parameter -> an acme object's id

    def send(self, client: httpx.Client, method: str, path: str, route: str) -> httpx.Response:
        if method not in STATE_CHANGING:
            return client.request(method, path)
        return client.request(method, path, json=BODIES.get((method, route), {}))


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    clients: list[httpx.Client] = []
    with front_and_back(request, tmp_path_factory.mktemp("tenants")) as hubs:
        try:
            yield tenants_world(hubs, clients)
        finally:
            for client in clients:
                client.close()


def tenants_world(hubs: FrontBack, clients: list[httpx.Client]) -> World:
    """Acme's objects, made on the front hub; default's user and admin signed in there and sent to the back one."""
    server = hubs.front
    profiles = {"local": ["default"], "acme-src": ["default"]}
    for name, role, tenant in (("alice", "user", "default"), ("root", "admin", "default"),
                               ("carol", "user", ACME), ("oscar", "admin", ACME)):  # fmt: skip
        add_account(server, name, role, tenant=tenant, allowed_profiles=profiles)
    for name in ("alice", "root", "carol", "oscar"):
        clients.append(login(server, name))  # each closed at the end, even when a later one fails
    alice, root, carol, oscar = clients[-4:]
    fields = parse_registration({"name": "acme node", "source": "acme-src", "allowedProfiles": ["default"]},
                                default_server_url=server.url)  # fmt: skip
    runner = server.hub.registry.register(ACME, fields).runner
    task = carol.post("/api/tasks", json={"title": "acme's", "prompt": "acme's work", "cell": "acme-src",
                                          "profile": "default"})  # fmt: skip
    assert task.status_code == 201, task.text
    task_id = task.json()["task"]["id"]
    assert carol.post(f"/api/tasks/{task_id}/submit").status_code == 200
    approved = oscar.post(f"/api/tasks/{task_id}/approve")
    assert approved.status_code == 200, approved.text
    # the ids are real: acme's own admin reaches them
    job_id = approved.json()["job"]["id"]
    assert oscar.get(f"/api/jobs/{job_id}").status_code == 200
    assert oscar.get("/settings/accounts/carol").status_code == 200
    assert any(r["id"] == runner.id for r in oscar.get("/api/admin/runners").json()["runners"])
    ids = {"task_id": task_id, "job_id": approved.json()["job"]["id"], "username": "carol",
           "runner_id": runner.id, "source": "acme-src"}  # fmt: skip
    clients += [back_alice := hubs.moved(alice), back_root := hubs.moved(root)]
    return World(hubs, back_alice, back_root, ids)


def test_every_path_parameter_is_filled_here_or_covered_elsewhere() -> None:
    names = {name for _, path in WITH_PARAMETERS for name in re.findall(r"{(\w+)}", path)}
    assert sorted(names - set(FILLED) - ELSEWHERE.keys()) == [], "a path parameter no matrix fills with another's"
    assert len(HERE) >= 19  # today: tasks, jobs, accounts, runners, sources


@pytest.mark.parametrize(("method", "path"), HERE, ids=[f"{m} {p}" for m, p in HERE])
def test_another_tenant_s_object_is_not_found_for_this_tenant_s_user_and_admin(
    world: World, method: str, path: str
) -> None:  # fmt: skip
    url = re.sub(r"{(\w+)}", lambda m: world.ids[m.group(1)], path)
    kind = MATRIX[(method, path)]
    callers = [world.root] if kind in ("api_admin", "admin_page", "admin_part") else [world.alice, world.root]
    before = world.hubs.state()
    for client in callers:
        answer = world.send(client, method, url, path)
        assert answer.status_code == 404, (client is world.root, answer.status_code, answer.text[:200])
        if kind in ("page", "admin_page"):
            assert "text/html" in answer.headers["content-type"]
        else:
            assert answer.json()["code"] in ("not_found", "job_not_found"), answer.text
    assert world.hubs.state() == before
