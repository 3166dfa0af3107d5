"""What the chat route matrix (test_chat_route_matrix.py) sends each chat route: an unknown id per parameter,
every mutating route's valid request and bad ones (with their documented codes), the lists, and the bad values of
each read's query parameters and headers. A route these tables do not cover fails the matrix: add it here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from talaria.limits import MAX_ATTACHMENT_BYTES
from tests.integration.chat_matrix_support import ChatRoute

# An id of the right shape that names nothing, per parameter: Alice's ids must answer exactly as these do.
UNKNOWN = {
    "bot_id": "bot_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "conversation_id": "cnv_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "turn_id": "trn_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "attachment_id": "att_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "message_id": "msg_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "approval_id": "apr_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
}
NOT_FOUND_PAGE = "There is no page at this address."

Ids = dict[str, str]
Build = Callable[[Ids], dict[str, Any]]


@dataclass(frozen=True)
class Bad:
    """A refused request of a route: its httpx arguments (from the ids) and the documented code."""

    build: Build
    code: str = "invalid_request"
    status: int = 400


@dataclass(frozen=True)
class Request:
    """How the matrix fills a mutating route: a valid request (httpx arguments from the ids), the ids its body
    names (besides the path's), and bad requests that must be refused."""

    build: Build
    body_ids: tuple[str, ...] = ()
    bad: tuple[Bad, ...] = ()


def _json(body: dict[str, Any]) -> dict[str, Any]:
    return {"json": body}


def _raw(text: str) -> dict[str, Any]:
    return {"content": text.encode(), "headers": {"Content-Type": "application/json"}}


def _upload(name: str | None, data: bytes = b"taken over", media_type: str = "text/plain") -> dict[str, Any]:
    params = {} if name is None else {"name": name}
    return {"content": data, "params": params, "headers": {"Content-Type": media_type}}


BOT_BODY = {"name": "Taken over", "source": "local", "profile": "default"}
# Every mutating chat route: the request the matrix sends (as Alice would, to change her objects).
REQUESTS: dict[str, Request] = {
    "POST /api/bots": Request(lambda ids: _json(BOT_BODY), bad=(
        Bad(lambda ids: _json(BOT_BODY | {"colour": "red"})), Bad(lambda ids: _json(BOT_BODY | {"name": 5})),
        Bad(lambda ids: _json({"name": "x", "source": "local"})), Bad(lambda ids: _raw("{not json")),
        Bad(lambda ids: _json(BOT_BODY | {"name": "a@b"})))),
    "PATCH /api/bots/{bot_id}": Request(lambda ids: _json({"archived": True, "name": "Taken over"}), bad=(
        Bad(lambda ids: _json({"archived": "yes"})), Bad(lambda ids: _json({"name": "x", "colour": "red"})),
        Bad(lambda ids: _json({})), Bad(lambda ids: _json({"name": None})), Bad(lambda ids: _raw("[1]")))),
    "POST /api/conversations": Request(lambda ids: _json({"botId": ids["bot_id"]}), body_ids=("bot_id",), bad=(
        Bad(lambda ids: _json({"botId": ids["bot_id"], "colour": "red"})), Bad(lambda ids: _json({"botId": 5})),
        Bad(lambda ids: _json({"botId": ids["bot_id"], "title": ""})), Bad(lambda ids: _raw("null")))),
    "PATCH /api/conversations/{conversation_id}": Request(
        lambda ids: _json({"archived": True, "title": "Taken over"}), bad=(
            Bad(lambda ids: _json({"title": 5})), Bad(lambda ids: _json({"archived": True, "colour": "red"})),
            Bad(lambda ids: _json({})), Bad(lambda ids: _json({"title": "a\u202eb"})), Bad(lambda ids: _raw("x")))),
    "POST /api/conversations/{conversation_id}/turns": Request(
        lambda ids: _json({"text": "taken over", "attachments": [ids["attachment_id"]]}), body_ids=("attachment_id",),
        bad=(Bad(lambda ids: _json({"text": "hi", "colour": "red"})), Bad(lambda ids: _json({"text": 5})),
             Bad(lambda ids: _json({"text": "hi", "attachments": ids["attachment_id"]})),
             Bad(lambda ids: _json({"text": "   "})), Bad(lambda ids: _raw("{")),
             Bad(lambda ids: {"json": {"text": "hi"}, "headers": {"Idempotency-Key": "not a key"}},
                 "idempotency_key_invalid"))),
    "POST /api/conversations/{conversation_id}/turns/{turn_id}/stop": Request(lambda ids: {}),
    "POST /api/conversations/{conversation_id}/turns/{turn_id}/approvals": Request(
        lambda ids: _json({"approvalId": ids["approval_id"], "choice": "once"}), body_ids=("approval_id",), bad=(
            Bad(lambda ids: _json({"approvalId": ids["approval_id"], "choice": "always"})),
            Bad(lambda ids: _json({"approvalId": ids["approval_id"], "choice": "once", "colour": "red"})),
            Bad(lambda ids: _json({"approvalId": ids["approval_id"], "answer": "yes"})),
            Bad(lambda ids: _json({"approvalId": 5, "choice": "once"})),
            Bad(lambda ids: _json({"approvalId": ids["approval_id"], "choice": 1})), Bad(lambda ids: _raw("[]")))),
    "POST /api/conversations/{conversation_id}/attachments": Request(lambda ids: _upload("taken.txt"), bad=(
        Bad(lambda ids: _upload("a/b.txt")), Bad(lambda ids: _upload(None)), Bad(lambda ids: _upload("")),
        Bad(lambda ids: _upload("a\u0007b")),
        Bad(lambda ids: _upload("a.zip", b"PK\x03\x04zip", "application/zip"), "attachment_kind_unsupported", 415),
        Bad(lambda ids: _upload("fake.png", b"not a png", "image/png"), "attachment_kind_unsupported", 415),
        Bad(lambda ids: _upload("big.txt", b"x" * (MAX_ATTACHMENT_BYTES + 1)), "attachment_too_large", 413))),
    "DELETE /api/conversations/{conversation_id}/attachments/{attachment_id}": Request(lambda ids: {}),
}  # fmt: skip
# The chat routes that name no object of anyone else: lists (whose answers must omit Alice's objects), with the
# queries they are read with, and creating one's own bot.
LISTS: dict[str, tuple[dict[str, str], ...]] = {
    "GET /api/bots": ({}, {"archived": "true"}),
    "GET /api/bot-profiles": ({},),
    "GET /api/conversations": ({}, {"archived": "true"}),
    "GET /chats": ({}, {"archived": "1"}),
    "GET /bots": ({}, {"archived": "1"}),
}
OWN_ONLY = {"POST /api/bots"}
# Query parameters of chat GET routes: values each must refuse (400 invalid_request; a page's 400 page), or none
# for a parameter that takes anything (an unknown ``?bot=`` preselects nothing, ``?archived=`` is a flag).
BAD_QUERIES: dict[tuple[str, str], tuple[str, ...]] = {
    ("/api/bots", "archived"): ("maybe",),
    ("/api/bots", "limit"): ("0", "101", "x"),
    ("/api/bots", "cursor"): ("not-a-cursor",),
    ("/api/conversations", "archived"): ("maybe",),
    ("/api/conversations", "limit"): ("0", "101", "x"),
    ("/api/conversations", "cursor"): ("not-a-cursor",),
    ("/api/conversations/{conversation_id}/messages", "limit"): ("0", "101"),
    ("/api/conversations/{conversation_id}/messages", "cursor"): ("not-a-cursor",),
    ("/api/conversations/{conversation_id}/events", "after"): ("-1", "x"),
    ("/chats", "archived"): (),
    ("/chats", "bot"): (),
    ("/chats", "cursor"): ("not-a-cursor",),
    ("/bots", "archived"): (),
    ("/chats/{conversation_id}", "before"): ("not-a-cursor",),
}
BAD_HEADERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("/api/conversations/{conversation_id}/events", "Last-Event-ID"): ("-1", "x", "1.5"),
}


def id_keys(route: ChatRoute) -> tuple[str, ...]:
    """The ids a request of ``route`` names (path, then body); fails for a route the matrix cannot fill."""
    unknown = [name for name in route.path_params if name not in UNKNOWN]
    assert unknown == [], f"{route.label}: the matrix cannot fill the path parameter(s) {unknown}"
    if route.mutating:
        assert route.label in REQUESTS, f"{route.label}: a mutating chat route without a request in REQUESTS"
        return route.path_params + REQUESTS[route.label].body_ids
    return route.path_params


def request_of(route: ChatRoute, ids: Ids) -> dict[str, Any]:
    return REQUESTS[route.label].build(ids) if route.mutating else {}


def names_ids(route: ChatRoute) -> bool:
    """Whether a request of ``route`` names an object (in its path or body); a mutating route the matrix does not
    know counts, so that ``id_keys`` fails it."""
    return bool(route.path_params) or (route.mutating and (route.label not in REQUESTS or
                                                          bool(REQUESTS[route.label].body_ids)))  # fmt: skip


def bad_reads(route: ChatRoute) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(what, httpx arguments, status) of each bad query value and header of ``route``; fails for one the matrix
    does not know."""
    for name in route.query_params:
        assert (route.path, name) in BAD_QUERIES, f"{route.label}: the matrix does not know the query {name!r}"
        for value in BAD_QUERIES[route.path, name]:
            yield f"?{name}={value}", {"params": {name: value}}, 400
    for name in route.header_params:
        assert (route.path, name) in BAD_HEADERS, f"{route.label}: the matrix does not know the header {name!r}"
        for value in BAD_HEADERS[route.path, name]:
            yield f"{name}: {value}", {"headers": {name: value}}, 400


def bad_requests(route: ChatRoute, ids: Ids) -> list[tuple[str, dict[str, Any], int]]:
    """(what, httpx arguments, status) of each bad request of ``route``: its REQUESTS' bad ones, or a read's bad
    query values and headers."""
    if route.mutating:
        return [(f"bad request {n}", bad.build(ids), bad.status) for n, bad in enumerate(REQUESTS[route.label].bad)]
    return list(bad_reads(route))
