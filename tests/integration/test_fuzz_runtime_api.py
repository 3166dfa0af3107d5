"""Issue 17, part 2: a hypothesis fuzzer over the Runtime API's signed requests (lifecycle.md 6), with a bounded
example count, against a real hub on 127.0.0.1 with a job claimed and started by a signed worker.

Each example is one request to a Runtime route: the worker's own body with fields replaced or added, any JSON, or raw
bytes; signed correctly, or with the signature broken one way (another body or target signed, another secret, a
timestamp outside the window, a header dropped or changed after signing, a garbled signature), and any
``Idempotency-Key``. Whatever arrives: no 5xx, every refusal in the canonical ``{"code", "error"}`` shape, and a
refused request changes no table but the rate-limited ``security_event`` log (lifecycle.md 8). A request the hub
accepts may move the job on, as it would for a real worker; the audit chain verifies at the end."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from talaria.clock import SystemClock
from talaria.testing.hub_server import HubServer
from talaria.testing.runtime_client import PREFIX, RuntimeClient
from tests.conftest import PROXY_SECRET
from tests.integration.runtime_support import Worker, close_clients, dispatched_job

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPS = ("claim", "start", "heartbeat", "complete", "fail", "cancel")
TABLES = ("hermes_job", "task", "dispatch", "idempotency_key", "audit_event", "hermes_result")
SIGNED = ("X-Talaria-Principal", "X-Talaria-Roles", "X-Talaria-Tenant", "X-Talaria-Proxy-Timestamp",
          "X-Talaria-Proxy-Signature")  # fmt: skip
VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["binding", "lease_id", "lease_epoch", "worker_instance", "result", "error", "reason",
                          "progress", "evidence", "extra"])  # fmt: skip
FAULTS = st.one_of(
    st.just(("none", None)),  # three times: a third of the examples reach the body checks behind the signature
    st.just(("none", None)),
    st.just(("none", None)),
    st.tuples(st.just("other_body"), st.binary(min_size=1, max_size=20)),
    st.tuples(st.just("other_target"), st.text(VISIBLE, min_size=1, max_size=20)),
    st.tuples(st.just("other_secret"), st.text(VISIBLE, min_size=32, max_size=40)),
    st.tuples(st.just("timestamp"), st.integers(301, 10**9) | st.integers(-(10**9), -301)),
    st.tuples(st.just("drop"), st.sampled_from(SIGNED)),
    st.tuples(st.just("change"), st.tuples(st.sampled_from(SIGNED), st.text(VISIBLE, min_size=1, max_size=40))),
)
KEYS = st.one_of(
    st.uuids().map(lambda u: u.hex), st.uuids().map(str), st.none(), st.text(VISIBLE, min_size=1, max_size=300)
)


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, Worker]]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    server = HubServer(data, SystemClock(), runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET).start()
    try:
        job, binding = dispatched_job(server)
        worker = Worker.of(server, job, binding, "worker-a")
        assert worker.claim().status_code == 200
        assert worker.start().status_code == 200
        yield server, worker
        assert server.hub.engine.verify_audit().ok
    finally:
        close_clients()
        server.stop()


def snapshot(server: HubServer) -> tuple[Any, ...]:
    conn = sqlite3.connect(f"file:{server.settings.sqlite_path}?mode=ro", uri=True)
    try:
        return tuple(conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in TABLES)
    finally:
        conn.close()


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes, tuple[str, Any], str | None]:
    op = draw(st.sampled_from((*OPS, "GET list", "GET job")))
    if op.startswith("GET"):
        return "GET", op, b"", draw(FAULTS), None
    both = st.just({"binding": "own", "lease": "own"})
    own = st.one_of(both, st.fixed_dictionaries({}, optional={"binding": st.just("own"), "lease": st.just("own")}))
    replaced = st.one_of(st.just({}), st.dictionaries(FIELDS, JSON, max_size=2))  # {}: the worker's own body
    shaped = st.tuples(own, replaced).map(lambda pair: {"shape": pair[0], "fields": pair[1]})
    body = draw(st.one_of(shaped, JSON.map(lambda v: {"raw": json.dumps(v)}), st.binary(max_size=100)))
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return "POST", op, raw, draw(FAULTS), draw(KEYS)


def build(worker: Worker, op: str, raw: bytes) -> tuple[str, bytes]:
    """The target and the body bytes: a drawn ``shape`` becomes the worker's own binding and lease."""
    client = worker.client
    if op == "GET list":
        return PREFIX + "/jobs?" + urlencode({"tenant": "default", "cell": "local", "profile": "default"}), b""
    if op == "GET job":
        return PREFIX + f"/jobs/{worker.job}?" + urlencode(worker.binding), b""
    try:
        drawn = json.loads(raw)
    except ValueError:
        drawn = None
    if isinstance(drawn, dict) and set(drawn) == {"shape", "fields"}:
        body: dict[str, Any] = {}
        if "binding" in drawn["shape"]:
            body["binding"] = client.binding({"binding": worker.binding})
        if "lease" in drawn["shape"] and worker.lease is not None:
            body |= worker.lease
        raw = json.dumps(body | drawn["fields"]).encode()
    elif isinstance(drawn, dict) and set(drawn) == {"raw"}:
        raw = drawn["raw"].encode()
    return PREFIX + f"/jobs/{worker.job}/{op}", raw


def send(worker: Worker, method: str, op: str, raw: bytes, fault: tuple[str, Any], key: str | None) -> httpx.Response:
    target, body = build(worker, op, raw)
    kind, value = fault
    client = worker.client
    if kind == "other_secret":
        client = RuntimeClient(str(client.http.base_url), value, principal=client.principal, clock=client.clock)
    signed_target = target + value if kind == "other_target" else target
    signed_body = body + value if kind == "other_body" else body
    headers = client.headers(method, signed_target, signed_body)
    if client is not worker.client:
        client.close()
    if kind == "timestamp":
        headers["X-Talaria-Proxy-Timestamp"] = str(int(headers["X-Talaria-Proxy-Timestamp"]) + value)
    elif kind == "drop":
        headers.pop(value)
    elif kind == "change":
        headers[value[0]] = value[1] if value[1] != headers[value[0]] else value[1] + "x"
    if method == "POST":
        headers["Content-Type"] = "application/json"
        if key is not None:
            headers["Idempotency-Key"] = key
    return worker.client.http.request(method, target, content=body or None, headers=headers)


@EXAMPLES
@given(request=requests())
def test_any_signed_request_is_answered_without_a_5xx_and_a_refusal_changes_nothing(
    started: tuple[HubServer, Worker], request: tuple[str, str, bytes, tuple[str, Any], str | None]
) -> None:
    server, worker = started
    before = snapshot(server)
    answer = send(worker, *request)
    event(f"{request[3][0]} {answer.status_code}")
    assert answer.status_code < 500, (answer.status_code, answer.text)
    if answer.status_code >= 400:
        body = answer.json()
        assert set(body) == {"code", "error"} and all(isinstance(v, str) and v for v in body.values()), body
        assert snapshot(server) == before, (answer.status_code, body)
    elif request[3][0] != "none":
        raise AssertionError(f"a broken signature was accepted: {request[3][0]} {answer.status_code}")


def test_after_the_fuzzing_the_worker_reads_its_job_as_stored(started: tuple[HubServer, Worker]) -> None:
    server, worker = started
    answer = worker.client.status(worker.job, worker.binding)
    assert answer.status_code == 200, answer.text
    conn = sqlite3.connect(f"file:{server.settings.sqlite_path}?mode=ro", uri=True)
    try:
        [(state,)] = conn.execute("SELECT state FROM hermes_job WHERE id = ?", (worker.job,)).fetchall()
    finally:
        conn.close()
    assert (answer.json()["job"], answer.json()["state"]) == (worker.job, state)
