"""Issue 17, part 2: a hypothesis fuzzer over the bodies of Talaria's Hermes plugin routes ``POST
/api/plugins/talaria/bind`` and ``/unbind`` (hermes.md 8), with a bounded example count, on real Hermes with the
plugin installed and one live idle session.

A bind body is a good one for that session with one to three fields made wrong (missing, of another type, or a
value the plugin must refuse: a bridge that is not ``http://127.0.0.1:<port>``, a short token, an expiry in the
past or too far ahead, ``native_tools`` not true), with unknown fields added; or a well-formed one naming another
session, stored session or profile; or any JSON; or raw bytes, up to past the 64 KiB limit. Whatever arrives: the
answer is a 4xx JSON object ``{"ok": false, "code", "error"}``, the grant bearer in the body never comes back, and
nothing is bound: afterwards the session has no binding to remove, the plugin is still ready and the session binds
for real."""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hermes.conftest import Node
from tests.hermes.sessions import Session

EXAMPLES = settings(
    max_examples=120, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
PLUGIN = "/api/plugins/talaria"
GENERATION = "g-fuzz"
MAX_BODY_BYTES = 64 * 1024
REFUSALS = {400, 404, 409, 413}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
NOT_STRING = JSON.filter(lambda v: not isinstance(v, str))
MISSING = object()


def _wrong(now_ms: int) -> dict[str, st.SearchStrategy[Any]]:
    """For each field of a bind body, values the plugin must refuse (MISSING drops the field): near misses twice
    as often as the field missing, empty or of another type."""
    junk = st.one_of(st.just(MISSING), st.just(""), NOT_STRING)
    not_true = st.one_of(st.just(MISSING), JSON.filter(lambda v: v is not True))  # True is native_tools' good value
    near = {
        "native_tools": st.sampled_from([False, "true", 1, None]),
        "session_id": st.uuids().map(str),
        "stored_session_id": st.text(min_size=1, max_size=40),
        "profile": st.sampled_from(["Default", "../default", "default\n", "-x", "a" * 65]),
        "generation": st.just(""),
        "bridge_url": st.sampled_from(
            [
                "http://127.0.0.1:0",
                "http://127.0.0.1:65536",
                "http://localhost:8080",
                "https://127.0.0.1:8080",
                "http://127.0.0.1:8080/x",
                "http://127.0.0.2:8080",
                "http://[::1]:8080",
                "http://127.0.0.1:8080\n",
                "http://127.0.0.1:123456",
            ]
        ),
        "token": st.text(min_size=1, max_size=31),
        "expires_at": st.sampled_from(
            [now_ms - 1, now_ms - 60_000, now_ms + 31 * 60_000, True, float(now_ms + 60_000), str(now_ms + 60_000)]
        ),
    }
    others = {name: not_true if name == "native_tools" else junk for name in near}
    return {name: st.one_of(values, values, others[name]) for name, values in near.items()}


def _bind_body(session: Session, token: str, now_ms: int) -> dict[str, Any]:
    return {"native_tools": True, "session_id": session.runtime_id, "stored_session_id": session.stored_id,
            "profile": "default", "generation": GENERATION, "bridge_url": "http://127.0.0.1:9", "token": token,
            "expires_at": now_ms + 120_000}  # fmt: skip


@st.composite
def broken_bind(draw: st.DrawFn, session: Session, token: str) -> bytes:
    now_ms = int(time.time() * 1000)
    body = _bind_body(session, token, now_ms)
    wrong = _wrong(now_ms)
    count = draw(st.sampled_from([1, 1, 1, 2, 3]))  # mostly one: each check is then the one that decides
    for name in draw(st.permutations(sorted(wrong)))[:count]:
        value = draw(wrong[name])
        if value is MISSING:
            del body[name]
        else:
            body[name] = value
    body |= draw(st.dictionaries(st.text(max_size=12).filter(lambda k: k not in body), JSON, max_size=2))
    return json.dumps(body).encode()


@st.composite
def another_session(draw: st.DrawFn, session: Session, token: str) -> bytes:
    """A well-formed body naming another session, stored session or profile (the plugin's session checks)."""
    body = _bind_body(session, token, int(time.time() * 1000))
    name = draw(st.sampled_from(["session_id", "stored_session_id", "profile"]))
    other = st.sampled_from(["p2", "other"]) if name == "profile" else st.uuids().map(str)
    body[name] = draw(other)
    return json.dumps(body).encode()


def _post(client: httpx.Client, route: str, raw: bytes) -> httpx.Response:
    return client.post(f"{PLUGIN}/{route}", content=raw, headers={"Content-Type": "application/json"})


def test_any_bind_body_is_refused_cleanly_and_binds_nothing(node: Node) -> None:
    session = Session.open(node)
    token = secrets.token_urlsafe(32)  # the grant bearer of the bodies: it must never come back
    headers = {"X-Hermes-Session-Token": node.hermes.session_token}
    with httpx.Client(base_url=node.hermes.url, headers=headers, timeout=30) as client:
        bodies = st.one_of(
            broken_bind(session, token),
            broken_bind(session, token),
            another_session(session, token),
            another_session(session, token),
            JSON.map(lambda v: json.dumps(v).encode()),
            st.binary(max_size=200),
            st.just(b"{" + b" " * MAX_BODY_BYTES + b"}"),  # just past the plugin's limit
        )

        seen: Counter[str] = Counter()

        @EXAMPLES
        @given(raw=bodies, route=st.sampled_from(["bind", "bind", "bind", "unbind"]))
        def fuzz(raw: bytes, route: str) -> None:
            answer = _post(client, route, raw)
            seen[f"{route} {answer.status_code} {answer.json().get('code', '')}"] += 1
            assert token not in answer.text
            body = answer.json()
            if route == "unbind" and answer.status_code == 200:
                assert body == {"ok": True, "removed": 0}, body  # nothing was ever bound to remove
                return
            assert answer.status_code in REFUSALS, (answer.status_code, body, raw[:300])
            assert body["ok"] is False and isinstance(body["code"], str) and isinstance(body["error"], str), body
            assert set(body) == {"ok", "code", "error"}, body

        fuzz()
        print(f"plugin answers: {dict(seen)}")
        # the examples reached every check: the body's shape, the session lookup, the session's own fields
        assert {"bind 400 invalid_request", "bind 404 session_not_found", "bind 413 invalid_request"} <= set(seen)
        assert any(key.startswith("bind 409 ") for key in seen), seen
        # nothing was bound: unbinding the good body's generation removes nothing; the plugin is still ready
        unbound = _post(client, "unbind", json.dumps({"session_id": session.runtime_id,
                                                      "generation": GENERATION}).encode())  # fmt: skip
        assert unbound.json() == {"ok": True, "removed": 0}
        assert client.get(f"{PLUGIN}/capabilities").json()["ready"] is True
    # and the session binds for real, through the runner
    session.bind()
    session.unbind()
    session.close()
