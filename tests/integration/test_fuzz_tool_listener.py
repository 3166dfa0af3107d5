"""Issue 17, part 2: a hypothesis fuzzer over a grant's loopback tool listener (runner-protocol.md 12.3), with a
bounded example count, over real sockets on 127.0.0.1.

Each example is one connection carrying a request built from parts that are each right or wrong: the method, the
target, the ``Host``, ``Authorization``, ``Origin``, ``Content-Type``, ``Content-Length`` and ``Transfer-Encoding``
headers (missing, repeated, garbled), other headers, and the body (JSON or bytes, shorter or longer than announced);
or raw bytes. The client then closes its sending side, so a request that stops early ends at once. Whatever arrives:

- the listener answers a well-formed HTTP/1.1 response or closes without one (a request that never completed);
- no 5xx; every answer is ``Connection: close``, ``Cache-Control: no-store`` JSON; a refusal is exactly
  ``{"code", "error"}``;
- the grant's bearer never appears in an answer;
- the tool is called only for a request that passed every check (one right ``Host``, the bearer, no ``Origin``,
  ``POST``, JSON), with the body it announced, and every such well-formed request is served;
- afterwards no connection is left open, and a good request is still served."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from talaria.runner.grant_listener import MAX_BODY_BYTES, ToolListener

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BEARER = secrets.token_urlsafe(32)
CODE = re.compile(r"[a-z0-9_]{1,64}\Z")


@dataclass
class Listening:
    listener: ToolListener
    loop: asyncio.AbstractEventLoop
    calls: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.listener.port}"

    def exchange(self, raw: bytes) -> bytes:
        """Send ``raw`` on a new connection, close the sending side, read the answer to its end."""
        with socket.create_connection(("127.0.0.1", self.listener.port), timeout=10) as sock:
            try:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # refused before the whole request was sent: its answer may still be there to read
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
            return answer


@pytest.fixture(scope="module")
def listening() -> Iterator[Listening]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tool-listener", daemon=True)
    thread.start()
    made: Listening | None = None

    async def serve(path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        assert made is not None
        made.calls.append((path, body))
        return 200, {"served": len(body)}

    listener = ToolListener(BEARER, serve)
    made = Listening(listener, loop)
    asyncio.run_coroutine_threadsafe(listener.start(), loop).result(10)
    try:
        yield made
    finally:
        asyncio.run_coroutine_threadsafe(listener.wait_closed(5), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def raw(self) -> bytes:
        head = f"{self.method} {self.target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers)
        return (head + "\r\n").encode("latin-1") + self.body


TOKEN = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"), min_size=1, max_size=16)
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\r\n"), max_size=40)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _broken(right: list[str], wrong: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    """A header's values when it is broken: missing, repeated, or wrong."""
    return st.one_of(st.just([]), st.just(right * 2), st.lists(wrong, min_size=1, max_size=2))


PARTS = ("method", "Host", "Authorization", "Origin", "Content-Type", "Content-Length", "Transfer-Encoding")


@st.composite
def requests(draw: st.DrawFn, host: str) -> Request:
    """Each part right, except at most three broken ones (so that about a third of the requests are good)."""
    body = draw(st.one_of(JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=300)))
    broken = draw(st.sets(st.sampled_from(PARTS), max_size=3))
    wrong = {
        "Host": st.sampled_from([host + "x", "localhost:" + host.rsplit(":")[1], "127.0.0.1", host.replace("1:", "2:")])
        | VALUE,
        "Authorization": st.sampled_from(
            [
                f"Bearer {BEARER[:-1]}",
                f"Basic {BEARER}",
                BEARER,
                f"Bearer  {BEARER}",
                f"Bearer {BEARER}x",
                f"bearer {BEARER}",
            ]
        )
        | VALUE,
        "Content-Type": st.sampled_from(
            ["text/plain", "application/jsonx", "", "application/json, text/plain", "APPLICATION/JSON; charset=utf-8"]
        )
        | VALUE,
        "Content-Length": st.sampled_from(
            [
                str(len(body) + 5),
                str(max(0, len(body) - 1)),
                "-1",
                "1e3",
                "\xb2",  # a superscript two: a digit to str.isdigit, not ASCII
                "0x10",
                str(MAX_BODY_BYTES + 1),
                "0" + str(len(body)),
            ]
        )
        | VALUE,
    }
    right = {"Host": [host], "Authorization": [f"Bearer {BEARER}"], "Origin": [], "Content-Type": ["application/json"],
             "Content-Length": [str(len(body))], "Transfer-Encoding": []}  # fmt: skip
    values = dict(right)
    for name in broken - {"method", "Origin", "Transfer-Encoding"}:
        values[name] = draw(_broken(right[name], wrong[name]))
    if "Origin" in broken:
        values["Origin"] = [draw(VALUE)]
    if "Transfer-Encoding" in broken:
        values["Transfer-Encoding"] = ["chunked"]
    method = draw(st.sampled_from(["GET", "PUT", "post", "OPTIONS"])) if "method" in broken else "POST"
    target = draw(st.sampled_from(["/tools/call", "/tools/list", "/", "/tools/call?x=1"]) | TOKEN.map("/".__add__))
    headers = [(name, value) for name, listed in values.items() for value in listed]
    headers += draw(st.lists(st.tuples(TOKEN, VALUE), max_size=3))
    return Request(method, target, list(draw(st.permutations(headers))), body)


def _parse(answer: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, status, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1", lines[0]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(headers["content-length"]) == len(body), answer[:300]
    return int(status), headers, json.loads(body)


def _served_body(request: Request, host: str) -> bytes | None:
    """The body the listener must serve ``request`` with, or None when its checks must refuse it
    (runner-protocol.md 12.3), read from the request's parts as sent (a value's outer blanks are not part of it)."""

    def values(name: str) -> list[str]:
        return [v.strip(" \t") for k, v in request.headers if k.lower() == name]

    authorization = values("authorization")
    scheme, _, presented = authorization[0].partition(" ") if len(authorization) == 1 else ("", "", "")
    content_type = values("content-type")
    lengths = values("content-length")
    if not (
        values("host") == [host]
        and not values("origin")
        and scheme.lower() == "bearer"
        and presented == BEARER
        and request.method == "POST"
        and len(content_type) == 1
        and content_type[0].split(";")[0].strip().lower() == "application/json"
        and not values("transfer-encoding")
    ):
        return None
    if not lengths:
        return b""  # no Content-Length: an empty body, whatever follows
    if len(set(lengths)) != 1 or not (lengths[0].isdigit() and lengths[0].isascii()):
        return None
    length = int(lengths[0])
    if length > MAX_BODY_BYTES or length > len(request.body):
        return None  # too large, or the connection ends before the body does
    return request.body[:length]


def _check(listening: Listening, raw: bytes, *, count: bool = True) -> tuple[int | None, list[tuple[str, bytes]]]:
    before = len(listening.calls)
    answer = listening.exchange(raw)
    calls = listening.calls[before:]
    assert BEARER.encode() not in answer
    if not answer:
        if count:
            event("closed without an answer")
        return None, calls
    status, headers, body = _parse(answer)
    if count:
        event(f"answered {status}")
    assert status < 500, answer[:300]
    assert (headers["connection"], headers["cache-control"]) == ("close", "no-store"), headers
    assert headers["content-type"] == "application/json", headers
    if status != 200:
        assert set(body) == {"code", "error"} and CODE.match(body["code"]), body
        assert not calls, (status, body)
    return status, calls


@EXAMPLES
@given(data=st.data())
def test_any_request_is_answered_canonically_and_only_a_good_one_is_served(
    listening: Listening, data: st.DataObject
) -> None:
    request = data.draw(requests(listening.host))
    status, calls = _check(listening, request.raw())
    served = _served_body(request, listening.host)
    if served is not None:
        assert status == 200 and calls == [(request.target, served)], (status, request)
    else:
        assert not calls, request


@EXAMPLES
@given(raw=st.one_of(st.binary(max_size=400), st.binary(max_size=200).map(lambda b: b + b"\r\n\r\n")))
def test_raw_bytes_are_refused_or_dropped_and_never_served(listening: Listening, raw: bytes) -> None:
    status, calls = _check(listening, raw)
    assert not calls and status != 200, (status, raw)


def test_afterwards_nothing_is_left_open_and_a_good_request_is_served(listening: Listening) -> None:
    headers = [("Host", listening.host), ("Authorization", f"Bearer {BEARER}"), ("Content-Type", "application/json"),
               ("Content-Length", "2")]  # fmt: skip
    good = Request("POST", "/tools/call", headers, b"{}")
    status, calls = _check(listening, good.raw(), count=False)
    assert (status, calls) == (200, [("/tools/call", b"{}")])
    handlers = asyncio.run_coroutine_threadsafe(_open_handlers(listening.listener), listening.loop).result(10)
    assert handlers == 0


async def _open_handlers(listener: ToolListener) -> int:
    return len(listener._handlers)
