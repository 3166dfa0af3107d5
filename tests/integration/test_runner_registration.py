"""Runner registration, listing and disabling over a real hub (runner-protocol.md 2 and 3, web-api.md 4)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from talaria.clock import ManualClock
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.runner_support import (
    SUMMARY_KEYS,
    TOKEN_RE,
    UUID_RE,
    Machine,
    admin_of,
    register,
    runner_summary,
)
from tests.integration.web_support import assert_error, cheapen_argon2

RUNNERS = "/api/admin/runners"


pytestmark = pytest.mark.usefixtures("fast_argon2")


@pytest.fixture
def server(make_hub: Callable[..., HubServer]) -> HubServer:
    return make_hub()


@pytest.fixture
def admin(server: HubServer) -> Iterator[httpx.Client]:
    client = admin_of(server)
    yield client
    client.close()


@pytest.fixture(scope="module")
def shared_admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One hub for the refusal tables (a refused registration changes nothing)."""
    with pytest.MonkeyPatch.context() as patch:
        cheapen_argon2(patch)
        server = HubServer(tmp_path_factory.mktemp("refusals") / "data", ManualClock()).start()
        try:
            client = admin_of(server)
            yield client
            client.close()
        finally:
            server.stop()


@pytest.fixture
def user(server: HubServer) -> Iterator[httpx.Client]:
    add_account(server, "uma", "user", allowed_profiles={"local": ["default"]})
    client = login(server, "uma")
    yield client
    client.close()


def no_store(response: httpx.Response) -> None:
    assert response.headers.get("cache-control") == "no-store", (response.request.url.path, response.headers)


# --- registration (section 2) -----------------------------------------------------------------------------------


def test_registration_answers_the_summary_a_one_time_token_and_the_complete_runner_json(
    server: HubServer, admin: httpx.Client
) -> None:
    response = admin.post(RUNNERS, json={"name": "  node 1  ", "allowedProfiles": ["default", "research"]})
    assert response.status_code == 201, response.text
    no_store(response)
    body = response.json()
    assert set(body) == {"runner", "token", "config"}
    runner, token, config = body["runner"], body["token"], body["config"]
    assert TOKEN_RE.match(token), "32 random bytes, base64url without padding: 43 characters"
    assert set(runner) == SUMMARY_KEYS
    assert UUID_RE.match(runner["id"])
    assert runner["name"] == "node 1"
    assert runner["source"] == "local"
    assert runner["tenant"] == "default"
    assert runner["allowedProfiles"] == ["default", "research"]
    assert runner["enabled"] is True
    assert runner["createdAt"] == server.clock.now_ms()
    assert (runner["online"], runner["lastSeenAt"], runner["connectedAt"], runner["features"]) == (
        False,
        None,
        None,
        [],
    )
    assert runner["runnerVersion"] is None
    assert config == {
        "protocol": 1,
        "serverURL": server.url,
        "runnerId": runner["id"],
        "token": token,
        "hermesURL": "http://127.0.0.1:9119",
        "allowedProfiles": ["default", "research"],
        "artifactRoots": [],
    }


def test_registration_keeps_given_fields_normalised_and_allow_insecure_lan_only_when_true(
    admin: httpx.Client,
) -> None:
    config = register(
        admin,
        name="lan node",
        source="lab.2",
        allowedProfiles=["research", "default", "research", "default", "ops"],
        serverURL="http://192.168.1.20:8700/",
        hermesURL="http://[::1]:9200/",
        artifactRoots=["/srv/artifacts", "/tmp/out"],
        allowInsecureLan=True,
    )["config"]
    assert config["serverURL"] == "http://192.168.1.20:8700"
    assert config["hermesURL"] == "http://[::1]:9200"
    assert config["allowedProfiles"] == ["research", "default", "ops"], "deduplicated keeping first occurrences"
    assert config["artifactRoots"] == ["/srv/artifacts", "/tmp/out"]
    assert config["allowInsecureLan"] is True
    assert "hermesCredentials" not in config
    other = register(admin, source="other", serverURL="https://hub.example.com/", allowInsecureLan=False)["config"]
    assert other["serverURL"] == "https://hub.example.com"
    assert "allowInsecureLan" not in other, "emitted only when true"
    assert set(other) == {"protocol", "serverURL", "runnerId", "token", "hermesURL", "allowedProfiles", "artifactRoots"}


def test_256_profiles_after_removing_duplicates_are_accepted(admin: httpx.Client) -> None:
    names = [f"p{i}" for i in range(256)]
    config = register(admin, allowedProfiles=names + names[:10])["config"]
    assert config["allowedProfiles"] == names


@pytest.mark.parametrize(
    "profiles",
    [
        [f"p{i}" for i in range(257)],
        [f"p{i}" for i in range(257)] + ["p0", "p1"],
        [],
        ["default", "a/b"],
        ["a\\b"],
        ["tab\there"],
        [""],
        ["x" * 257],
        ["default", 7],
        "default",
        None,
    ],
    ids=[
        "257",
        "257-after-dedupe",
        "empty",
        "slash",
        "backslash",
        "control",
        "empty-name",
        "too-long",
        "not-str",
        "not-list",
        "null",
    ],
)
def test_bad_assigned_profiles_are_400_invalid_assigned_profiles(shared_admin: httpx.Client, profiles: Any) -> None:
    response = shared_admin.post(RUNNERS, json={"name": "n", "allowedProfiles": profiles})
    assert_error(response, 400, "invalid_assigned_profiles", profiles)
    no_store(response)


def test_missing_assigned_profiles_are_invalid_assigned_profiles(shared_admin: httpx.Client) -> None:
    assert_error(shared_admin.post(RUNNERS, json={"name": "n"}), 400, "invalid_assigned_profiles")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": "rm -rf /"}, "command"),
        ({"hermesCredentials": {"username": "u", "password": "p"}}, "hermesCredentials"),
        ({"token": "x" * 43}, "token"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "n" * 101}, "name"),
        ({"name": 5}, "name"),
        ({"source": "Local"}, "source"),
        ({"source": "-x"}, "source"),
        ({"source": "a" * 65}, "source"),
        ({"source": "a/b"}, "source"),
        ({"serverURL": "ftp://hub.example.com"}, "serverURL"),
        ({"serverURL": "https://user:pw@hub.example.com"}, "serverURL"),
        ({"serverURL": "https://hub.example.com/?x=1"}, "serverURL"),
        ({"serverURL": "https://hub.example.com/#f"}, "serverURL"),
        ({"serverURL": "https://hub.example.com/talaria"}, "serverURL"),
        ({"serverURL": "http://192.168.1.20:8700"}, "serverURL"),
        ({"serverURL": 8700}, "serverURL"),
        ({"hermesURL": "http://localhost:9119"}, "hermesURL"),
        ({"hermesURL": "http://10.0.0.2:9119"}, "hermesURL"),
        ({"hermesURL": "http://127.0.0.1:9119/api"}, "hermesURL"),
        ({"hermesURL": "ws://127.0.0.1:9119"}, "hermesURL"),
        ({"artifactRoots": ["relative/path"]}, "artifactRoots"),
        ({"artifactRoots": [f"/r{i}" for i in range(65)]}, "artifactRoots"),
        ({"artifactRoots": "/srv"}, "artifactRoots"),
        ({"allowInsecureLan": "yes"}, "allowInsecureLan"),
        ({"allowInsecureLan": None}, "allowInsecureLan"),
    ],
)
def test_other_invalid_or_unknown_fields_are_400_invalid_runner_config_naming_the_field(
    shared_admin: httpx.Client, fields: dict[str, Any], field: str
) -> None:
    response = shared_admin.post(RUNNERS, json={"name": "n", "allowedProfiles": ["default"]} | fields)
    body = assert_error(response, 400, "invalid_runner_config", fields)
    assert field in body["error"], body
    no_store(response)


def test_values_at_the_edges_of_each_rule_are_accepted(admin: httpx.Client) -> None:
    edges: list[dict[str, Any]] = [
        {"name": "n" * 100},
        {"name": "  " + "n" * 100 + "  "},
        {"source": "a" * 64},
        {"source": "0._-"},
        {"allowedProfiles": ["p" * 256, "ünïcode profile"]},
        {"serverURL": "http://localhost:8700"},
        {"serverURL": "http://[::1]:8700/"},
        {"serverURL": "https://hub.example.com"},
        {"hermesURL": "https://127.0.0.1"},
        {"hermesURL": "http://[::1]:9119"},
    ]
    for index, fields in enumerate(edges):
        answer = register(admin, **({"source": f"edge{index}"} | fields))
        assert answer["runner"]["name"] == answer["runner"]["name"].strip()
        for key in ("serverURL", "hermesURL"):
            if key in fields:
                assert answer["config"][key] == fields[key].rstrip("/")
        if "allowedProfiles" in fields:
            assert answer["config"]["allowedProfiles"] == fields["allowedProfiles"]


def test_64_artifact_roots_are_accepted(admin: httpx.Client) -> None:
    roots = [f"/r{i}" for i in range(64)]
    assert register(admin, artifactRoots=roots)["config"]["artifactRoots"] == roots


def test_the_first_failing_field_in_section_3_order_is_named(shared_admin: httpx.Client) -> None:
    """Section 3's table orders serverURL, hermesURL, allowedProfiles, artifactRoots, allowInsecureLan."""
    both = {"name": "n", "allowedProfiles": ["default"], "serverURL": "ftp://x.example", "allowInsecureLan": "yes"}
    body = assert_error(shared_admin.post(RUNNERS, json=both), 400, "invalid_runner_config")
    assert "serverURL" in body["error"], body


def test_a_bad_hermes_url_is_named_before_bad_profiles_and_bad_profiles_before_bad_roots(
    shared_admin: httpx.Client,
) -> None:
    hermes_first = {"name": "n", "allowedProfiles": [], "hermesURL": "http://localhost:1"}
    body = assert_error(shared_admin.post(RUNNERS, json=hermes_first), 400, "invalid_runner_config")
    assert "hermesURL" in body["error"], body
    profiles_first = {"name": "n", "allowedProfiles": ["a/b"], "artifactRoots": ["relative"]}
    assert_error(shared_admin.post(RUNNERS, json=profiles_first), 400, "invalid_assigned_profiles")


@pytest.mark.parametrize("content", [b"[]", b'"runner"', b"null", b"7", b"not json", b""])
def test_a_body_that_is_not_a_json_object_is_400_invalid_request(shared_admin: httpx.Client, content: bytes) -> None:
    response = shared_admin.post(RUNNERS, content=content, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_request", content)
    no_store(response)


def test_one_enabled_runner_per_source_and_a_new_registration_after_disable(admin: httpx.Client) -> None:
    first = register(admin, source="local")["runner"]
    response = admin.post(RUNNERS, json={"name": "again", "allowedProfiles": ["default"]})
    assert_error(response, 409, "runner_source_in_use")
    no_store(response)
    register(admin, source="elsewhere")  # another source is free
    assert admin.delete(f"{RUNNERS}/{first['id']}").json() == {"ok": True}
    second = register(admin, name="replacement")
    assert second["runner"]["id"] != first["id"]
    assert second["runner"]["source"] == "local"


# --- listing (section 2) ----------------------------------------------------------------------------------------


def test_listing_holds_every_runner_with_its_liveness_and_never_the_token_or_its_hash(
    server: HubServer, admin: httpx.Client
) -> None:
    one = register(admin, name="one")
    two = register(admin, name="two", source="lab")
    assert admin.delete(f"{RUNNERS}/{two['runner']['id']}").status_code == 200
    machine = Machine(server, one["runner"]["id"], one["token"])
    try:
        machine.connect()
        response = admin.get(RUNNERS)
    finally:
        machine.close()
    assert response.status_code == 200, response.text
    no_store(response)
    body = response.json()
    assert set(body) == {"protocol", "runners"}
    assert body["protocol"] == 1
    by_id = {r["id"]: r for r in body["runners"]}
    assert set(by_id) == {one["runner"]["id"], two["runner"]["id"]}, "disabled runners are listed"
    for summary in body["runners"]:
        assert set(summary) == SUMMARY_KEYS
    online = by_id[one["runner"]["id"]]
    assert online["online"] is True
    assert online["enabled"] is True
    assert online["connectedAt"] == server.clock.now_ms()
    assert online["lastSeenAt"] == server.clock.now_ms()
    assert online["features"] == []
    assert online["runnerVersion"] is None, "httpx's User-Agent names no runner release"
    disabled = by_id[two["runner"]["id"]]
    assert disabled["enabled"] is False
    assert (disabled["online"], disabled["lastSeenAt"], disabled["connectedAt"], disabled["features"]) == (
        False,
        None,
        None,
        [],
    )
    for registered in (one, two):
        token = registered["token"]
        assert token not in response.text
        assert hashlib.sha256(token.encode()).hexdigest() not in response.text
        assert "tokenHash" not in response.text


def test_disable_is_idempotent_and_an_unknown_id_is_404(admin: httpx.Client) -> None:
    runner = register(admin)["runner"]
    for _ in range(2):
        response = admin.delete(f"{RUNNERS}/{runner['id']}")
        assert response.status_code == 200, response.text
        assert response.json() == {"ok": True}
        no_store(response)
    assert runner_summary(admin, runner["id"])["enabled"] is False
    for unknown in ("00000000-0000-4000-8000-000000000000", "not-a-runner"):
        response = admin.delete(f"{RUNNERS}/{unknown}")
        assert_error(response, 404, "not_found", unknown)
        no_store(response)


def test_a_runner_of_another_tenant_is_not_found(server: HubServer, admin: httpx.Client) -> None:
    runner = register(admin)["runner"]
    stranger = admin_of(server, "stranger", tenant="elsewhere", allowed_profiles={})
    try:
        assert_error(stranger.delete(f"{RUNNERS}/{runner['id']}"), 404, "not_found")
        listing = stranger.get(RUNNERS).json()
        assert listing == {"protocol": 1, "runners": []}
        # The source name is per tenant: the other tenant may use "local" too.
        assert register(stranger)["runner"]["tenant"] == "elsewhere"
    finally:
        stranger.close()
    assert runner_summary(admin, runner["id"])["enabled"] is True


# --- access rules (section 2, web-api.md 2) -------------------------------------------------------------------


def test_users_get_403_admin_required(admin: httpx.Client, user: httpx.Client) -> None:
    runner = register(admin)["runner"]
    for response in (
        user.get(RUNNERS),
        user.post(RUNNERS, json={"name": "n", "allowedProfiles": ["default"]}),
        user.delete(f"{RUNNERS}/{runner['id']}"),
    ):
        assert_error(response, 403, "admin_required", response.request.method)
        no_store(response)


def test_state_changes_need_the_csrf_token_and_the_hub_origin(server: HubServer, admin: httpx.Client) -> None:
    runner = register(admin)["runner"]
    csrf = admin.headers["X-CSRF-Token"]
    variants: list[dict[str, str]] = [
        {"X-CSRF-Token": "", "Origin": server.url},
        {"X-CSRF-Token": "wrong", "Origin": server.url},
        {"X-CSRF-Token": csrf, "Origin": "http://evil.example"},
    ]
    for headers in variants:
        response = admin.post(RUNNERS, json={"name": "n", "source": "x", "allowedProfiles": ["d"]}, headers=headers)
        assert_error(response, 403, "csrf_failed", headers)
        no_store(response)
        response = admin.delete(f"{RUNNERS}/{runner['id']}", headers=headers)
        assert_error(response, 403, "csrf_failed", headers)
    bare = server.client(cookies=admin.cookies)
    try:
        fresh = {"name": "n", "source": "x", "allowedProfiles": ["d"]}
        assert_error(bare.post(RUNNERS, json=fresh), 403, "csrf_failed")
        assert_error(bare.delete(f"{RUNNERS}/{runner['id']}"), 403, "csrf_failed")
    finally:
        bare.close()
    assert runner_summary(admin, runner["id"])["enabled"] is True
    assert [r["source"] for r in admin.get(RUNNERS).json()["runners"]] == ["local"]


def test_anonymous_requests_are_401(server: HubServer) -> None:
    with server.client(headers={"Origin": server.url}) as anon:
        for response in (anon.get(RUNNERS), anon.post(RUNNERS, json={}), anon.delete(f"{RUNNERS}/x")):
            assert_error(response, 401, "unauthenticated", response.request.method)
            no_store(response)


# --- sources (web-api.md 4) -------------------------------------------------------------------------------------


def test_sources_list_the_enabled_runner_of_each_source(admin: httpx.Client, user: httpx.Client) -> None:
    assert user.get("/api/sources").json() == {"sources": []}
    local = register(admin)["runner"]
    lab = register(admin, source="lab")["runner"]
    response = user.get("/api/sources")
    assert response.status_code == 200, response.text
    sources = {s["name"]: s for s in response.json()["sources"]}
    assert set(sources) == {"local", "lab"}
    assert set(sources["local"]) == {"name", "runner"}
    assert sources["local"]["runner"]["id"] == local["id"]
    assert set(sources["local"]["runner"]) == SUMMARY_KEYS
    assert sources["lab"]["runner"]["id"] == lab["id"]
    assert admin.delete(f"{RUNNERS}/{lab['id']}").status_code == 200
    sources = {s["name"]: s for s in user.get("/api/sources").json()["sources"]}
    assert sources["lab"]["runner"] is None, "a source keeps existing after its runner is disabled"
    assert sources["local"]["runner"]["id"] == local["id"]


def test_profiles_of_a_source_whose_runner_is_offline_are_503_runner_offline(
    admin: httpx.Client, user: httpx.Client
) -> None:
    register(admin)
    response = user.get("/api/sources/local/profiles")
    assert_error(response, 503, "runner_offline")
    assert_error(user.get("/api/sources/nowhere/profiles"), 404, "not_found")
