"""The live stream over a real hub and real HTTP (chat.md 4.1-4.2, 7): its checks in order (401, 404, 400, 429),
its headers and ``retry: 3000``, events in SSE form, resuming by ``Last-Event-ID`` or ``after`` with each later
event once, keepalives, and its end with the web session and at hub shutdown."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from talaria.canonical import canonical_json
from talaria.hub.timings import HubTimings
from talaria.testing.hub_server import HubServer
from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")

KEEPALIVE_S = 0.3
DELTA = "message.delta"


class Stream:
    """An open event stream read frame by frame (each wait bounded by the client's 10 s read timeout)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.iter_lines()

    def frame(self) -> list[str] | None:
        """The next frame's lines (a blank line ends it), or None when the hub ended the stream."""
        lines: list[str] = []
        for line in self._lines:
            if line == "":
                if lines:
                    return lines
                continue
            lines.append(line)
        assert lines == [], lines
        return None

    def event(self) -> dict[str, Any] | None:
        """The next event (keepalive comments skipped) as ``{id?, event, data}``, or None at the end."""
        while (lines := self.frame()) is not None:
            if lines != [": keepalive"]:
                fields = dict(line.split(": ", 1) for line in lines)
                return {**fields, "data": json.loads(fields["data"])}
        return None

    def ids(self, count: int) -> list[int]:
        found = [self.event() for _ in range(count)]
        return [int(event["id"]) for event in found if event is not None]


@dataclass
class Chat:
    web: Web
    mine: str  # uma's conversation
    theirs: str  # ulf's

    @property
    def hub(self) -> HubServer:
        return self.web.server

    def emit(self, conversation: str | None = None, **data: Any) -> int:
        return self.hub.hub.chat_events.emit(conversation or self.mine, DELTA, {"turnId": "trn_1", **data})

    def open(self, client: httpx.Client, conversation: str | None = None, **kwargs: Any) -> Stream:
        path = f"/api/conversations/{conversation or self.mine}/events"
        response = self.web.stack.enter_context(client.stream("GET", path, **kwargs))
        assert response.status_code == 200, response.read()
        stream = Stream(response)
        assert stream.frame() == ["retry: 3000"]
        return stream


def _conversation(web: Web, client: httpx.Client) -> str:
    made = client.post("/api/bots", json={"name": "Helper", "source": "local", "profile": "default"})
    assert made.status_code == 201, made.text
    started = client.post("/api/conversations", json={"botId": made.json()["bot"]["id"]})
    assert started.status_code == 201, started.text
    return str(started.json()["conversation"]["id"])


def _chat(make_hub: Callable[..., HubServer], stack: ExitStack, keepalive_s: float) -> Chat:
    web = Web(make_hub(timings=HubTimings(chat_keepalive_s=keepalive_s)), stack)
    node = web.admin.post("/api/admin/runners", json={"name": "node-1", "source": "local",
                                                      "allowedProfiles": ["default"]})  # fmt: skip
    assert node.status_code == 201, node.text
    return Chat(web, _conversation(web, web.user), _conversation(web, web.other))


@pytest.fixture
def chat(make_hub: Callable[..., HubServer]) -> Iterator[Chat]:
    """Uma's and Ulf's conversations on a hub whose streams keep alive every 0.3 s."""
    with ExitStack() as stack:
        yield _chat(make_hub, stack, KEEPALIVE_S)


def test_the_stream_answers_event_stream_headers_then_retry_then_events_in_sse_form(chat: Chat) -> None:
    stream = chat.open(chat.web.user)
    headers = stream.response.headers
    assert headers["content-type"] == "text/event-stream"
    assert (headers["cache-control"], headers["x-accel-buffering"]) == ("no-store", "no")
    assert headers["x-content-type-options"] == "nosniff"
    data = {"turnId": "trn_1", "messageId": "msg_1", "text": "two\nlines, é"}
    assert chat.hub.hub.chat_events.emit(chat.mine, DELTA, data) == 1
    assert stream.frame() == ["id: 1", f"event: {DELTA}",
                              "data: " + canonical_json(data | {"conversationId": chat.mine}).decode()]  # fmt: skip
    chat.emit(text="again")
    assert stream.event() == {"id": "2", "event": DELTA,
                              "data": {"turnId": "trn_1", "text": "again", "conversationId": chat.mine}}  # fmt: skip


def test_a_reconnect_with_last_event_id_gets_each_later_event_once(chat: Chat) -> None:
    first = chat.open(chat.web.user)
    for n in range(3):
        chat.emit(n=n)
    assert first.ids(3) == [1, 2, 3]
    first.response.close()
    chat.emit(n=3)
    chat.emit(n=4)
    # the header wins over the URL's after= (a reconnect keeps the original URL)
    again = chat.open(chat.web.user, params={"after": "0"}, headers={"Last-Event-ID": "3"})
    chat.emit(n=5)
    assert again.ids(3) == [4, 5, 6]
    chat.emit(n=6)
    assert again.ids(1) == [7]


def test_after_resumes_from_the_snapshot_s_last_event_id(chat: Chat) -> None:
    for n in range(3):
        chat.emit(n=n)
    stream = chat.open(chat.web.user, params={"after": "2"})
    chat.emit(n=3)
    assert stream.ids(2) == [3, 4]
    latest = chat.open(chat.web.user, params={"after": "004"})
    chat.emit(n=4)
    assert latest.ids(1) == [5]


def test_a_resume_point_above_the_last_issued_gets_a_reset_and_the_stream_ends(chat: Chat) -> None:
    chat.emit()
    for params, headers in (({"after": "2"}, {}), ({}, {"Last-Event-ID": "9" * 40})):
        stream = chat.open(chat.web.user, params=params, headers=headers)
        reset = {"conversationId": chat.mine, "reason": "unknown_event_id"}
        assert stream.frame() == ["event: stream.reset", "data: " + canonical_json(reset).decode()]
        assert stream.frame() is None


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "", " 1", "+1", "1e3", "\uff11"])
def test_a_resume_point_that_is_not_a_decimal_integer_is_invalid(chat: Chat, value: str) -> None:
    path = f"/api/conversations/{chat.mine}/events"
    assert_error(chat.web.user.get(path, params={"after": value}), 400, "invalid_request")
    if value.isascii() and value == value.strip():  # what may be sent as a header value
        assert_error(chat.web.user.get(path, headers={"Last-Event-ID": value}), 400, "invalid_request")
        assert_error(chat.web.user.get(path, params={"after": "1"}, headers={"Last-Event-ID": value}), 400,
                     "invalid_request")  # fmt: skip


def test_only_the_owner_sees_a_conversation_s_stream_and_only_signed_in(chat: Chat) -> None:
    for client, conversation in ((chat.web.user, chat.theirs), (chat.web.admin, chat.mine),
                                 (chat.web.user, "cnv_nosuch")):  # fmt: skip
        path = f"/api/conversations/{conversation}/events"
        assert_error(client.get(path), 404, "not_found")
        assert_error(client.get(path, params={"after": "x"}), 404, "not_found")  # visibility before the resume point
    assert_error(chat.web.anon().get(f"/api/conversations/{chat.mine}/events"), 401, "unauthenticated")


def test_an_account_holds_at_most_8_open_streams(chat: Chat) -> None:
    streams = [chat.open(chat.web.user) for _ in range(8)]
    path = f"/api/conversations/{chat.mine}/events"
    assert_error(chat.web.user.get(path), 429, "chat_stream_limit")
    assert_error(chat.web.user.get(path, params={"after": "x"}), 400, "invalid_request")  # checked before the limit
    chat.open(chat.web.other, chat.theirs)  # another account still can
    streams[0].response.close()
    assert chat.hub.hub.chat_streams.wait_open("uma", 7, timeout=10)
    chat.emit()
    assert chat.open(chat.web.user, params={"after": "0"}).ids(1) == [1]
    assert streams[1].ids(1) == [1]


def test_a_silent_stream_sends_keepalive_comments(chat: Chat) -> None:
    stream = chat.open(chat.web.user)
    assert stream.frame() == [": keepalive"]
    chat.emit()
    assert stream.ids(1) == [1]
    assert stream.frame() == [": keepalive"]


def test_signing_out_ends_the_stream_at_the_next_keepalive(chat: Chat) -> None:
    client = chat.web.login("uma")
    stream = chat.open(client)
    assert client.post("/api/auth/logout").status_code == 200
    assert stream.event() is None  # ended without an event
    assert chat.hub.hub.chat_streams.wait_open("uma", 0, timeout=10)


def test_a_changed_auth_version_ends_the_stream(chat: Chat) -> None:
    stream = chat.open(chat.web.user)
    changed = chat.web.admin.patch("/api/admin/accounts/uma", json={"allowedProfiles": {"local": ["default"]}})
    assert changed.status_code == 200, changed.text
    assert stream.event() is None
    assert chat.web.user.get(f"/api/conversations/{chat.mine}").status_code == 200  # the session itself lives on


def test_the_hub_stopping_ends_open_streams_without_waiting_for_a_keepalive(make_hub: Callable[..., HubServer]) -> None:
    with ExitStack() as stack:
        chat = _chat(make_hub, stack, 15.0)
        streams = [chat.open(chat.web.user), chat.open(chat.web.other, chat.theirs)]
        chat.emit()
        assert streams[0].ids(1) == [1]
        started = time.monotonic()
        chat.hub.stop()
        assert time.monotonic() - started < 5
        assert [stream.event() for stream in streams] == [None, None]
