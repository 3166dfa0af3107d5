"""Every chat route against everyone but the owner (chat.md 2 "Scoping", 3.2, 8, scenario 6; web-api.md 1-2): the
routes are read from the hub app's route table, so a chat route added later joins the matrix, and one the matrix
cannot fill (an unknown path, query or header parameter, a mutating route without a request in
chat_matrix_requests_support.py, a list it does not know) fails it.

Over a real hub, two real runner processes (tenants ``default`` and ``acme``) and the Hermes fixture: Alice's ids
(bots, conversations, a completed and a live turn, messages, a sent and an unsent attachment, a pending approval)
answer Bob, her tenant's admin and ``acme``'s user and admin exactly as unknown ids do, 404 ``not_found`` (the 404
page for a page), never 403, also mixed into their own conversations and turns and with bad input; her own ids
do not cross from one of her conversations into another; their lists omit her objects; her audit events hold keyed
digests and only she and her tenant's admin read them. Every mutating route refuses a request without a session,
CSRF token or Origin and bad bodies with the documented code, every read bad query values and headers, every path
the methods it does not serve. No refused request changes a row of the chat tables or the audit chain (a sqlite3
snapshot of the hub's file before and after)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import markupsafe
import pytest

from talaria.canonical import canonical_json
from tests.conftest import login
from tests.hermes.chat_support import audit_dump, audit_verifies
from tests.integration.chat_matrix_requests_support import (
    LISTS,
    NOT_FOUND_PAGE,
    OWN_ONLY,
    REQUESTS,
    UNKNOWN,
    Ids,
    bad_reads,
    bad_requests,
    id_keys,
    names_ids,
    request_of,
)
from tests.integration.chat_matrix_support import (
    ACME,
    PEOPLE,
    Answer,
    ChatRoute,
    Person,
    World,
    call,
    chat_routes,
    chat_tables,
    chat_world,
)
from tests.integration.web_support import FOREIGN_ORIGIN

ROUTES = chat_routes()
PROBERS = [name for name, _, _ in PEOPLE]
# chat.md 3.2's routes and 6.1's pages: the route table must hold at least these (a broken filter fails here).
SPECIFIED = {
    "GET /api/bots", "POST /api/bots", "GET /api/bots/{bot_id}", "PATCH /api/bots/{bot_id}", "GET /api/bot-profiles",
    "POST /api/conversations", "GET /api/conversations", "GET /api/conversations/{conversation_id}",
    "PATCH /api/conversations/{conversation_id}", "GET /api/conversations/{conversation_id}/messages",
    "POST /api/conversations/{conversation_id}/turns", "GET /api/conversations/{conversation_id}/turns/{turn_id}",
    "POST /api/conversations/{conversation_id}/turns/{turn_id}/stop",
    "POST /api/conversations/{conversation_id}/turns/{turn_id}/approvals",
    "POST /api/conversations/{conversation_id}/attachments",
    "DELETE /api/conversations/{conversation_id}/attachments/{attachment_id}",
    "GET /api/conversations/{conversation_id}/events", "GET /chats", "GET /bots", "GET /chats/{conversation_id}",
}  # fmt: skip


def route_id(route: ChatRoute) -> str:
    return route.label


# --- the world -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with chat_world(tmp_path_factory.mktemp("chat-matrix")) as built:
        yield built


@dataclass
class Unchanged:
    """The chat tables and audit chain, compared with their snapshot on ``check``."""

    data_dir: Path
    before: dict[str, list[tuple[Any, ...]]] = field(init=False)

    def __post_init__(self) -> None:
        self.before = chat_tables(self.data_dir)

    def check(self, what: str) -> None:
        after = chat_tables(self.data_dir)
        changed = [table for table in self.before if self.before[table] != after[table]]
        assert changed == [], f"{what} changed {changed}"


# --- filling a route -----------------------------------------------------------------------------------------------


def alice_cases(world: World, keys: tuple[str, ...], prober: Person) -> list[tuple[Ids, set[str]]]:
    """(ids, which of them are Alice's): every combination of Alice's ids, then ``crossed_cases`` into the
    prober's own conversation and turn."""
    mine = world.alice.ids
    cases = [(dict(zip(keys, values, strict=True)), set(keys))
             for values in itertools.product(*(mine[k] for k in keys))]  # fmt: skip
    return cases + crossed_cases(world, keys, prober.own)


def crossed_cases(world: World, keys: tuple[str, ...], own: Ids) -> list[tuple[Ids, set[str]]]:
    """Where the route names more than a conversation: ``own``'s conversation (and its turn, if it has one) with
    Alice's other ids (those of her first conversation) in the rest."""
    mine, cases = world.alice.ids, []
    if "conversation_id" in keys and len(keys) > 1:
        rest = tuple(k for k in keys if k != "conversation_id")
        for values in itertools.product(*(mine[k] for k in rest)):
            cases.append(({"conversation_id": own["conversation_id"]} | dict(zip(rest, values, strict=True)),
                          set(rest)))  # fmt: skip
        if "turn_id" in rest and len(rest) > 1 and "turn_id" in own:
            others = tuple(k for k in rest if k != "turn_id")
            for values in itertools.product(*(mine[k] for k in others)):
                inner = {"conversation_id": own["conversation_id"], "turn_id": own["turn_id"]}
                cases.append((inner | dict(zip(others, values, strict=True)), set(others)))
    return cases


def comparable(answer: Answer, ids: Ids) -> tuple[int, str, str]:
    """The answer with the ids it was asked about replaced by their parameter names."""
    body = answer.body
    for name, value in ids.items():
        body = body.replace(value, f"<{name}>")
    return answer.status, answer.media_type, body


def assert_not_found(answer: Answer, path: str, where: str) -> None:
    """404 ``not_found``: the canonical JSON error, or for a page (never under ``/api/``) the 404 page."""
    assert answer.status == 404, (where, answer.status, answer.body[:500])
    if answer.media_type == "text/html":
        assert not path.startswith("/api/"), where
        assert NOT_FOUND_PAGE in answer.body, where
    else:
        assert answer.media_type == "application/json", where
        body = answer.json
        assert set(body) == {"code", "error"} and body["code"] == "not_found" and body["error"], (where, body)


ID_ROUTES = [route for route in ROUTES if names_ids(route)]


# --- the tests ------------------------------------------------------------------------------------------------------


def test_the_matrix_reads_every_chat_route_from_the_route_table() -> None:
    labels = {route.label for route in ROUTES}
    assert labels >= SPECIFIED, SPECIFIED - labels
    assert {"GET /chats/{conversation_id}/transcript", "GET /chats/{conversation_id}/messages/{message_id}"} <= labels
    assert set(REQUESTS) <= labels and set(LISTS) | OWN_ONLY <= labels, "the tables name no such route"
    for route in ROUTES:  # a chat route that names no object is a list or makes one's own
        assert names_ids(route) or route.label in LISTS or route.label in OWN_ONLY, route.label


@pytest.mark.parametrize("prober", PROBERS)
@pytest.mark.parametrize("route", ID_ROUTES, ids=route_id)
def test_alice_s_ids_answer_everyone_else_as_unknown_ids_do_404_and_change_nothing(
    world: World, route: ChatRoute, prober: str
) -> None:
    keys = id_keys(route)
    person = world.people[prober]
    unchanged = Unchanged(world.server.data_dir)
    for ids, hers in alice_cases(world, keys, person):
        unknown = ids | {k: UNKNOWN[k] for k in hers}
        where = f"{prober}: {route.label} with Alice's {sorted(hers)}"
        answer = call(person.client, route.method, route.url(ids), **request_of(route, ids))
        assert_not_found(answer, route.path, where)
        same = call(person.client, route.method, route.url(unknown), **request_of(route, unknown))
        assert comparable(answer, ids) == comparable(same, unknown), where
        if route.method == "GET" and not route.path.startswith("/api/"):  # a page answers HEAD as GET
            head = call(person.client, "HEAD", route.url(ids))
            assert (head.status, head.media_type, head.body) == (404, answer.media_type, ""), where
        for (what, arguments, status), (_, other, _) in zip(bad_requests(route, ids), bad_requests(route, unknown),
                                                            strict=True):  # bad input: no oracle either  # fmt: skip
            refused = call(person.client, route.method, route.url(ids), **arguments)
            also = call(person.client, route.method, route.url(unknown), **other)
            assert refused.status in (status, 404), (where, what, refused)
            assert comparable(refused, ids) == comparable(also, unknown), (where, what)
    unchanged.check(f"{prober}'s requests of {route.label}")


# Routes naming a conversation and more (read without id_keys' checks: collecting must not fail, the tests do).
CROSSING = [
    route
    for route in ID_ROUTES
    if "conversation_id" in route.path_params
    and len(route.path_params) + len(REQUESTS[route.label].body_ids if route.label in REQUESTS else ()) > 1
]


@pytest.mark.parametrize("route", CROSSING, ids=route_id)
def test_alice_s_turns_messages_attachments_and_approvals_answer_404_through_her_other_conversation(
    world: World, route: ChatRoute
) -> None:
    """Scoping is by conversation too: her first conversation's ids named under her empty one answer as unknown
    ids do, and change nothing (stopping her live turn, answering her approval, removing her upload included)."""
    keys = id_keys(route)
    unchanged = Unchanged(world.server.data_dir)
    for ids, crossed in crossed_cases(world, keys, {"conversation_id": world.alice.ids["conversation_id"][2]}):
        unknown = ids | {k: UNKNOWN[k] for k in crossed}
        where = f"Alice: {route.label} with her first conversation's {sorted(crossed)}"
        answer = call(world.alice.client, route.method, route.url(ids), **request_of(route, ids))
        assert_not_found(answer, route.path, where)
        same = call(world.alice.client, route.method, route.url(unknown), **request_of(route, unknown))
        assert comparable(answer, ids) == comparable(same, unknown), where
    unchanged.check(f"Alice's crossed requests of {route.label}")


def _listed(client: httpx.Client, label: str) -> list[str]:
    method, path = label.split(" ", 1)
    return [call(client, method, path, params=query).body for query in LISTS[label]]


# The lists that show a kind of object: the owner finds all of hers there (active and archived), others none.
SHOWS = {"GET /api/bots": "bot_id", "GET /bots": "bot_id", "GET /api/conversations": "conversation_id",
         "GET /chats": "conversation_id"}  # fmt: skip


@pytest.mark.parametrize("prober", PROBERS)
def test_lists_omit_alice_s_objects(world: World, prober: str) -> None:
    person = world.people[prober]
    hers = [value for values in world.alice.ids.values() for value in values]
    texts = [form for text in world.alice.texts for form in (text, str(markupsafe.escape(text)))]
    unchanged = Unchanged(world.server.data_dir)
    for label in LISTS:
        shown = "\n".join(_listed(person.client, label))
        assert [x for x in hers + texts if x in shown] == [], (prober, label)
    chooser = call(person.client, "GET", "/chats", params={"bot": world.alice.ids["bot_id"][0]})  # her bot unchosen
    assert chooser.status == 200 and [x for x in hers + texts if x in chooser.body] == [], prober
    for label, kind in SHOWS.items():
        assert person.own[kind] in "\n".join(_listed(person.client, label)), (prober, label)
        alice = "\n".join(_listed(world.alice.client, label))
        assert [x for x in world.alice.ids[kind] if x not in alice] == [], label  # the lists can show them
    if person.role == "admin":  # an admin reads the tenant's audit: her tenant's holds her events, acme's not
        everything = person.client.get("/api/audit", params={"limit": 100})
        assert everything.status_code == 200, everything.text
        found = [x for x in hers if x in everything.text]
        if person.tenant == ACME:
            page = person.client.get("/audit")
            assert page.status_code == 200 and person.own["conversation_id"] in page.text, page.status_code
            assert found == [] and [x for x in hers if x in page.text] == [], found
        else:
            assert world.alice.ids["conversation_id"][0] in found, found
    unchanged.check(f"{prober}'s lists")


def test_alice_s_chat_audit_holds_keyed_digests_only_she_and_her_tenant_s_admin_read(world: World) -> None:
    key = (world.server.data_dir / "audit.key").read_bytes()
    conversation_id, bot_id = world.alice.ids["conversation_id"][0], world.alice.ids["bot_id"][0]
    subjects = ({"conversation": conversation_id}, {"bot": bot_id})
    unchanged = Unchanged(world.server.data_dir)
    mine = [world.alice.client.get("/api/audit", params=query) for query in subjects]
    assert [answer.status_code for answer in mine] == [200, 200], [answer.text for answer in mine]
    events = [e for answer in mine for e in answer.json()["events"]]
    kinds = {e["type"] for e in events}
    assert {"chat.bot.created", "chat.conversation.created", "chat.turn.started", "chat.turn.ended"} <= kinds
    evidence = [e["evidence"] for e in events if e["evidence"] is not None]
    assert all(set(e) == {"kind", "contentDigest"} and re.fullmatch("[0-9a-f]{64}", e["contentDigest"])
               for e in evidence), evidence  # fmt: skip
    for kind, value in world.alice.digests:
        keyed = hmac.new(key, canonical_json(value), hashlib.sha256).hexdigest()
        assert {"kind": kind, "contentDigest": keyed} in evidence, kind
        assert hashlib.sha256(canonical_json(value)).hexdigest() not in json.dumps(events), kind
    admin = world.people["ada"].client
    for query, answer in zip(subjects, mine, strict=True):
        assert admin.get("/api/audit", params=query).json()["events"] == answer.json()["events"], query
        for name in ("bob", "carol", "oscar"):
            refused = call(world.people[name].client, "GET", "/api/audit", params=query)
            unknown = call(world.people[name].client, "GET", "/api/audit",
                           params={k: UNKNOWN[f"{k}_id"] for k in query})  # fmt: skip
            assert_not_found(refused, "/api/audit", f"{name}: audit of {query}")
            assert (refused.status, refused.body) == (unknown.status, unknown.body), (name, query)
    whole = admin.get("/api/audit", params={"limit": 100}).text + audit_dump(world.server.data_dir)
    assert [text for text in world.alice.texts if text in whole] == []
    assert audit_verifies(world.server.data_dir)
    unchanged.check("reading the audit")


MUTATING = [route for route in ROUTES if route.mutating]


def _primary(world: World, route: ChatRoute) -> Ids:
    """Alice's most telling id for each the route names: her live turn, her unsent attachment, her approval."""
    return {key: world.alice.ids[key][0] for key in id_keys(route)}


def _client(world: World, headers: dict[str, str], signed_in: bool = True) -> httpx.Client:
    cookies = world.alice.client.cookies if signed_in else None
    return world.server.client(headers=headers, cookies=cookies)


@pytest.mark.parametrize("route", MUTATING, ids=route_id)
def test_a_mutating_chat_route_needs_a_session_the_csrf_token_and_the_origin(world: World, route: ChatRoute) -> None:
    ids = _primary(world, route)
    token, origin = world.alice.client.headers["X-CSRF-Token"], world.server.url
    refusals = [
        ({"Origin": origin}, True, 403, "csrf_failed"),
        ({"Origin": origin, "X-CSRF-Token": "not-the-token"}, True, 403, "csrf_failed"),
        ({"Origin": FOREIGN_ORIGIN, "X-CSRF-Token": token}, True, 403, "csrf_failed"),
        ({"X-CSRF-Token": token}, True, 403, "csrf_failed"),
        ({"Origin": origin, "X-CSRF-Token": token}, False, 401, "unauthenticated"),
    ]
    unchanged = Unchanged(world.server.data_dir)
    for headers, signed_in, status, code in refusals:
        with _client(world, headers, signed_in) as client:
            answer = call(client, route.method, route.url(ids), **request_of(route, ids))
        assert (answer.status, answer.media_type) == (status, "application/json"), (route.label, headers, answer)
        assert answer.json["code"] == code and set(answer.json) == {"code", "error"}, (route.label, headers)
    unchanged.check(f"refused requests of {route.label}")


@pytest.mark.parametrize("route", MUTATING, ids=route_id)
def test_a_mutating_chat_route_refuses_bad_input_with_its_code_and_changes_nothing(
    world: World, route: ChatRoute
) -> None:
    ids = _primary(world, route)
    unchanged = Unchanged(world.server.data_dir)
    for n, bad in enumerate(REQUESTS[route.label].bad):
        answer = call(world.alice.client, route.method, route.url(ids), **bad.build(ids))
        where = f"{route.label} bad request {n}"
        assert (answer.status, answer.media_type) == (bad.status, "application/json"), (where, answer)
        assert answer.json["code"] == bad.code and set(answer.json) == {"code", "error"}, (where, answer.json)
    unchanged.check(f"bad requests of {route.label}")


GETS = [route for route in ROUTES if not route.mutating]


@pytest.mark.parametrize("route", GETS, ids=route_id)
def test_a_chat_read_refuses_bad_query_values_and_headers_with_400(world: World, route: ChatRoute) -> None:
    ids = _primary(world, route)
    unchanged = Unchanged(world.server.data_dir)
    for what, arguments, _ in bad_reads(route):
        answer = call(world.alice.client, "GET", route.url(ids), **arguments)
        where = f"{route.label} {what}"
        assert answer.status == 400, (where, answer.status, answer.body[:300])
        if answer.media_type == "text/html":
            assert not route.path.startswith("/api/") and "<code>invalid_request</code>" in answer.body, where
        else:
            assert answer.json == {"code": "invalid_request", "error": answer.json["error"]}, where
    unchanged.check(f"bad reads of {route.label}")


PATHS = sorted({route.path for route in ROUTES})


@pytest.mark.parametrize("path", PATHS)
def test_a_method_a_chat_path_does_not_serve_is_405(world: World, path: str) -> None:
    served = {route.method for route in ROUTES if route.path == path}
    route = next(route for route in ROUTES if route.path == path)
    ids = {key: world.alice.ids[key][0] for key in route.path_params}
    unchanged = Unchanged(world.server.data_dir)
    for method in sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - served):
        answer = call(world.alice.client, method, route.url(ids), json={})
        assert (answer.status, answer.media_type) == (405, "application/json"), (method, path, answer)
        assert answer.json["code"] == "method_not_allowed" and set(answer.json) == {"code", "error"}, (method, path)
    unchanged.check(f"other methods of {path}")


@pytest.fixture(scope="module")
def ended_session(world: World) -> Iterator[httpx.Client]:
    """A client of Alice's whose session has been signed out (its cookie and CSRF token kept)."""
    client = login(world.server, "alice")
    try:
        assert client.post("/api/auth/logout").status_code == 200
        yield client
    finally:
        client.close()


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_every_chat_route_wants_a_live_session(world: World, ended_session: httpx.Client, route: ChatRoute) -> None:
    """Without a session, or with a signed-out one: 401 ``unauthenticated`` (a page: the sign-in redirect)."""
    ids = {key: world.alice.ids[key][0] for key in route.path_params}
    ids |= {key: world.alice.ids[key][0] for key in UNKNOWN if key not in ids}
    unchanged = Unchanged(world.server.data_dir)
    with world.server.client(headers={"Origin": world.server.url, "X-CSRF-Token": "x"}) as anonymous:
        for client in (anonymous, ended_session):
            answer = call(client, route.method, route.url(ids), **request_of(route, ids))
            if answer.status == 303:
                assert route.method == "GET" and not route.path.startswith("/api/"), route.label
                assert answer.location.startswith("/login?next=%2Fchats") or answer.location == "/login?next=%2Fbots"
            else:
                assert (answer.status, answer.json["code"]) == (401, "unauthenticated"), (route.label, answer)
    unchanged.check(f"requests of {route.label} without a session")
