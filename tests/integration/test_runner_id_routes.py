"""A runner id that is not a UUID names no route: 404 ``not_found`` whatever the method (issue 11, defect 6).

runner-protocol.md 4: "A ``runnerId`` that is not a UUID or an op not in the table gets the hub's ordinary 404
``not_found``", and route and method are matched first, so a wrong method is 405 only on a path that names a
runner. The same holds for the admin routes under ``/api/admin/runners/{id}`` (section 2). A wrong method on a path
with a well-formed id keeps its 405 ``method_not_allowed`` with ``Allow``. Real hub, raw httpx requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from talaria.testing.hub_server import HubServer
from tests.integration.runner_support import (
    MACHINE,
    Machine,
    admin_of,
    assert_machine_error,
    register,
    runner_summary,
)
from tests.integration.web_support import assert_error

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MACHINE_OPS = {"poll": "GET", "admit": "POST", "result": "POST", "event": "POST", "tool": "POST", "goodbye": "POST"}
# Admin routes naming one runner: the path below /api/admin/runners/{id} and its one method.
ADMIN_ROUTES = {"": "DELETE", "/hermes": "GET", "/test-turn": "POST"}
UNKNOWN_RUNNER = "00000000-0000-4000-8000-000000000000"


pytestmark = pytest.mark.usefixtures("fast_argon2")


@dataclass
class Site:
    server: HubServer
    admin: httpx.Client
    runner_id: str
    token: str

    def not_uuids(self) -> tuple[str, ...]:
        """Ids that are not lower-case UUIDs, one of them this runner's id upper-cased."""
        return ("not-a-uuid", UNKNOWN_RUNNER[:-1], UNKNOWN_RUNNER + "0", self.runner_id.upper(), "x")


@pytest.fixture
def site(make_hub: Callable[..., HubServer]) -> Iterator[Site]:
    server = make_hub()
    admin = admin_of(server)
    registered = register(admin)
    try:
        yield Site(server, admin, registered["runner"]["id"], registered["token"])
    finally:
        admin.close()


def test_machine_api_a_non_uuid_runner_id_is_404_for_every_method(site: Site) -> None:
    machine = Machine(site.server, site.runner_id, site.token)
    try:
        with httpx.Client(base_url=site.server.url, timeout=10.0) as client:
            for runner_id in site.not_uuids():
                for op in MACHINE_OPS:
                    for method in METHODS:
                        url = f"{MACHINE}/{runner_id}/{op}"
                        response = client.request(method, url, headers=machine.headers(), content=b"{}")
                        assert_machine_error(response, 404, "not_found", (method, url))
                        assert "allow" not in response.headers, (method, url)
    finally:
        machine.close()
    summary = runner_summary(site.admin, site.runner_id)
    assert summary["lastSeenAt"] is None and summary["online"] is False, "route matching has no effect on any state"


def test_machine_api_a_wrong_method_on_a_uuid_runner_id_is_still_405(site: Site) -> None:
    machine = Machine(site.server, site.runner_id, site.token)
    try:
        with httpx.Client(base_url=site.server.url, timeout=10.0) as client:
            for runner_id in (site.runner_id, UNKNOWN_RUNNER):
                for op, allowed in MACHINE_OPS.items():
                    for method in METHODS:
                        if method == allowed:
                            continue
                        url = f"{MACHINE}/{runner_id}/{op}"
                        response = client.request(method, url, headers=machine.headers(), content=b"{}")
                        assert_machine_error(response, 405, "method_not_allowed", (method, url))
                        assert response.headers.get("allow") == allowed, (method, url)
    finally:
        machine.close()
    assert runner_summary(site.admin, site.runner_id)["lastSeenAt"] is None


def test_admin_routes_a_non_uuid_runner_id_is_404_for_every_method(site: Site) -> None:
    for runner_id in site.not_uuids():
        for suffix in ADMIN_ROUTES:
            for method in METHODS:
                url = f"/api/admin/runners/{runner_id}{suffix}"
                response = site.admin.request(method, url, json={"prompt": "hi"})
                assert_error(response, 404, "not_found", (method, url))
                assert "allow" not in response.headers, (method, url)
    summary = runner_summary(site.admin, site.runner_id)
    assert summary["enabled"] is True, "the upper-cased id did not disable the runner"


def test_admin_routes_a_wrong_method_on_a_uuid_runner_id_is_still_405(site: Site) -> None:
    for runner_id in (site.runner_id, UNKNOWN_RUNNER):
        for suffix, allowed in ADMIN_ROUTES.items():
            for method in METHODS:
                if method == allowed:
                    continue
                url = f"/api/admin/runners/{runner_id}{suffix}"
                response = site.admin.request(method, url, json={"prompt": "hi"})
                assert_error(response, 405, "method_not_allowed", (method, url))
                assert response.headers.get("allow") == allowed, (method, url)
    assert runner_summary(site.admin, site.runner_id)["enabled"] is True


def test_admin_routes_the_allowed_method_with_an_unknown_uuid_is_still_404(site: Site) -> None:
    for suffix, method in ADMIN_ROUTES.items():
        url = f"/api/admin/runners/{UNKNOWN_RUNNER}{suffix}"
        assert_error(site.admin.request(method, url, json={"prompt": "hi"}), 404, "not_found", (method, url))
