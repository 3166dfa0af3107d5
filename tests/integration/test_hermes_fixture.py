"""The Hermes fixture over real sockets: guards, REST, the JSON-RPC gateway, WebSocket loss and the knobs
(hermes.md 2-6 and 11). httpx for REST, the ``websockets`` sync client for ``/api/ws``."""

from __future__ import annotations

import base64
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from talaria.testing.hermes_fixture import HermesFixture, Knobs

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


class Gateway:
    """A JSON-RPC client of ``/api/ws`` that keeps every event it reads, in order."""

    def __init__(self, hermes: HermesFixture, *, wait_ready: bool = True) -> None:
        origin = Origin(hermes.origin)
        self.ws: ClientConnection = connect(hermes.ws_url, proxy=None, origin=origin, open_timeout=5, legacy=True)
        self.events: list[dict[str, Any]] = []
        self.responses: dict[str, dict[str, Any]] = {}
        if wait_ready:
            first = self.frame()
            assert first["params"]["type"] == "gateway.ready", first

    def frame(self, timeout: float = 5.0) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(self.ws.recv(timeout=timeout))
        return frame

    def _read(self, timeout: float = 5.0) -> None:
        frame = self.frame(timeout)
        if frame.get("method") == "event":
            self.events.append(frame["params"])
        else:
            self.responses[str(frame.get("id"))] = frame

    def send(self, method: str, **params: Any) -> str:
        rid = str(uuid.uuid4())
        self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        return rid

    def response(self, rid: str, timeout: float = 5.0) -> dict[str, Any]:
        while rid not in self.responses:
            self._read(timeout)
        return self.responses.pop(rid)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.response(self.send(method, **params))

    def result(self, method: str, **params: Any) -> dict[str, Any]:
        reply = self.call(method, **params)
        assert "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result

    def error(self, method: str, **params: Any) -> tuple[int, str]:
        reply = self.call(method, **params)
        assert "error" in reply, reply
        return reply["error"]["code"], reply["error"]["message"]

    def until(self, kind: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Events up to and including the next one of type ``kind`` (removed from ``events``)."""
        while not any(e["type"] == kind for e in self.events):
            self._read(timeout)
        index = next(i for i, e in enumerate(self.events) if e["type"] == kind)
        taken, self.events = self.events[: index + 1], self.events[index + 1 :]
        return taken

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def hermes() -> Iterator[HermesFixture]:
    with HermesFixture(profiles=["default", "work"]) as fixture:
        yield fixture
        assert fixture.internal_errors() == []


@pytest.fixture
def gateway(hermes: HermesFixture) -> Iterator[Callable[..., Gateway]]:
    opened: list[Gateway] = []

    def open_gateway(target: HermesFixture | None = None, **kwargs: Any) -> Gateway:
        client = Gateway(target or hermes, **kwargs)
        opened.append(client)
        return client

    yield open_gateway
    for client in opened:
        client.close()


@pytest.fixture
def rest(hermes: HermesFixture) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hermes.url, trust_env=False, timeout=10) as client:
        yield client


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def slow_turns(hermes: HermesFixture, *, deltas: int = 5, delay: float = 0.15) -> None:
    hermes.knobs.delta_count = deltas
    hermes.knobs.delta_delay = delay


def refused(url: str, **kwargs: Any) -> int:
    with pytest.raises(InvalidStatus) as caught:
        connect(url, proxy=None, open_timeout=5, **kwargs)
    return caught.value.response.status_code


# --- lifecycle and guards --------------------------------------------------------------------------------------


def test_start_and_stop_are_idempotent_and_stop_is_safe_before_start() -> None:
    fixture = HermesFixture()
    fixture.stop()
    assert fixture.start() is fixture.start()
    assert fixture.url == f"http://127.0.0.1:{fixture.port}"
    fixture.stop()
    fixture.stop()
    assert HermesFixture().session_token != HermesFixture().session_token
    assert HermesFixture(session_token="given-token").session_token == "given-token"


def test_every_api_route_but_status_needs_the_session_token(hermes: HermesFixture, rest: httpx.Client) -> None:
    assert rest.get("/api/status").json()["auth_required"] is False
    assert rest.get("/api/profiles").status_code == 401
    assert rest.get("/api/profiles", headers={"X-Hermes-Session-Token": "wrong"}).status_code == 401
    assert rest.get("/api/nothing-here").status_code == 401
    assert rest.get("/api/profiles", headers=hermes.auth_headers()).status_code == 200
    bearer = {"Authorization": f"Bearer {hermes.session_token}"}
    assert rest.get("/api/profiles", headers=bearer).status_code == 200
    assert rest.get("/api/nothing-here", headers=bearer).status_code == 404
    status = rest.get("/api/status").json()
    assert {k: status[k] for k in ("version", "auth_required", "auth_providers")} == {
        "version": "0.19.0",
        "auth_required": False,
        "auth_providers": [],
    }
    assert {"gateway_running", "active_sessions", "active_agents"} <= set(status)


def test_the_websocket_needs_the_token_in_the_query(hermes: HermesFixture) -> None:
    base = f"ws://127.0.0.1:{hermes.port}/api/ws"
    assert refused(base) == 403
    assert refused(base + "?token=wrong") == 403
    with connect(hermes.ws_url, proxy=None, open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["params"]["type"] == "gateway.ready"
    assert [r.status for r in hermes.requests("/api/ws")] == [403, 403, 101]


def test_host_header_must_name_the_bound_address(hermes: HermesFixture, rest: httpx.Client) -> None:
    auth = hermes.auth_headers()
    assert rest.get("/api/profiles", headers={**auth, "Host": "evil.test"}).status_code == 400
    assert rest.get("/api/status", headers={"Host": f"evil.test:{hermes.port}"}).status_code == 400
    assert rest.get("/api/status", headers={"Host": f"127.0.0.1:{hermes.port + 1}"}).status_code == 400
    # Hermes checks the credential first.
    assert rest.get("/api/profiles", headers={"Host": "evil.test"}).status_code == 401
    sock = socket.create_connection(("127.0.0.1", hermes.port))
    try:
        url = f"ws://evil.test:{hermes.port}/api/ws?token={hermes.session_token}"
        assert refused(url, sock=sock) == 403
    finally:
        sock.close()


def test_websocket_origin_if_sent_must_be_the_server_origin(hermes: HermesFixture) -> None:
    assert refused(hermes.ws_url, origin=Origin("http://evil.test")) == 403
    assert refused(hermes.ws_url, origin=Origin(f"http://localhost:{hermes.port}")) == 403
    with connect(hermes.ws_url, proxy=None, origin=Origin(hermes.origin), open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["params"]["type"] == "gateway.ready"


def test_request_log_keeps_bodies_and_drops_credentials(hermes: HermesFixture, rest: httpx.Client) -> None:
    rest.get("/api/config", params={"profile": "work"}, headers=hermes.auth_headers())
    rest.post("/api/plugins/talaria/unbind", json={"session_id": "x", "generation": "g"}, headers=hermes.auth_headers())
    Gateway(hermes).close()
    config, unbind, upgrade = hermes.requests()
    assert (config.method, config.path, config.query, config.status) == ("GET", "/api/config", {"profile": "work"}, 200)
    assert config.headers["x-hermes-session-token"] == "<redacted>"
    assert unbind.body == {"session_id": "x", "generation": "g"}
    assert (upgrade.method, upgrade.query["token"]) == ("WEBSOCKET", "<redacted>")
    assert hermes.session_token not in repr(hermes.requests())


def test_dashboard_mode_serves_the_token_page_and_serve_mode_does_not(hermes: HermesFixture) -> None:
    with HermesFixture(dashboard=True) as dashboard, httpx.Client(trust_env=False) as client:
        page = client.get(dashboard.url + "/")
        assert f'window.__HERMES_SESSION_TOKEN__="{dashboard.session_token}"' in page.text
        assert client.get(hermes.url + "/").status_code == 404
        hermes.knobs.dashboard_page = True
        assert hermes.session_token in client.get(hermes.url + "/").text


# --- REST ------------------------------------------------------------------------------------------------------


def test_profiles_and_config(hermes: HermesFixture, rest: httpx.Client) -> None:
    auth = hermes.auth_headers()
    profiles = rest.get("/api/profiles", headers=auth).json()["profiles"]
    assert [(p["name"], p["is_default"]) for p in profiles] == [("default", True), ("work", False)]
    assert {"path", "model", "provider"} <= set(profiles[1])
    config = rest.get("/api/config", params={"profile": "work"}, headers=auth).json()
    assert config["tools"]["tool_search"]["enabled"] == "off"
    assert rest.get("/api/config", params={"profile": "nobody"}, headers=auth).status_code == 404


def test_session_messages_page_oldest_first(hermes: HermesFixture, rest: httpx.Client) -> None:
    rows = [{"role": "user", "content": f"m{i}"} for i in range(3)]
    sid = hermes.seed_session(rows)
    auth = hermes.auth_headers()
    body = rest.get(f"/api/sessions/{sid}/messages", params={"limit": 2}, headers=auth).json()
    assert body["session_id"] == sid
    assert [m["content"] for m in body["messages"]] == ["m0", "m1"]
    assert body["pagination"] == {"limit": 2, "offset": 0, "returned": 2}
    rest_page = rest.get(f"/api/sessions/{sid}/messages", params={"limit": 2, "offset": 2}, headers=auth).json()
    assert [m["content"] for m in rest_page["messages"]] == ["m2"]
    capped = rest.get(f"/api/sessions/{sid}/messages", params={"limit": 9999}, headers=auth).json()
    assert capped["pagination"] == {"limit": 500, "offset": 0, "returned": 3}
    assert rest.get(f"/api/sessions/{sid[:-2]}/messages", headers=auth).json()["session_id"] == sid
    assert rest.get("/api/sessions/20000101_000000_abcdef/messages", headers=auth).status_code == 404
    assert rest.get(f"/api/sessions/{sid}/messages", params={"profile": "work"}, headers=auth).status_code == 404


def test_file_download_is_an_attachment(hermes: HermesFixture, rest: httpx.Client, tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    report.write_text("result\n")
    got = rest.get("/api/files/download", params={"path": str(report)}, headers=hermes.auth_headers())
    assert got.status_code == 200
    assert got.content == b"result\n"
    assert got.headers["content-disposition"].startswith("attachment")
    assert "report.txt" in got.headers["content-disposition"]
    by_query = rest.get("/api/files/download", params={"path": str(report), "token": hermes.session_token})
    assert by_query.status_code == 200
    missing = rest.get("/api/files/download", params={"path": str(tmp_path / "gone")}, headers=hermes.auth_headers())
    assert missing.status_code == 404
    (tmp_path / ".env").write_text("SECRET=1\n")
    secret = rest.get("/api/files/download", params={"path": str(tmp_path / ".env")}, headers=hermes.auth_headers())
    assert secret.status_code == 403


# --- JSON-RPC --------------------------------------------------------------------------------------------------


def test_a_turn_streams_to_message_complete_and_is_stored(
    hermes: HermesFixture, gateway: Callable[..., Gateway], rest: httpx.Client
) -> None:
    gw = gateway()
    created = gw.result("session.create", close_on_disconnect=False)
    rid, stored = created["session_id"], created["stored_session_id"]
    assert len(rid) == 8 and int(rid, 16) >= 0
    day, clock, suffix = stored.split("_")
    assert (len(day), len(clock), len(suffix)) == (8, 6, 6)
    assert created["info"]["lazy"] is True
    info = gw.until("session.info")[-1]
    assert (info["session_id"], info["payload"]["stored_session_id"]) == (rid, stored)
    # Before the first prompt the stored id is unknown to REST and to resume.
    assert rest.get(f"/api/sessions/{stored}/messages", headers=hermes.auth_headers()).status_code == 404
    assert gw.error("session.resume", session_id=stored)[0] == 4007

    assert gw.result("prompt.submit", session_id=rid, text="hello marker-1") == {"status": "streaming"}
    events = gw.until("message.complete")
    assert types(events)[0] == "message.start"
    assert types(events)[1:-1] == ["message.delta"] * 3
    assert all(e["session_id"] == rid for e in events)
    complete = events[-1]["payload"]
    assert (complete["status"], complete["text"]) == ("complete", "echo: hello marker-1")
    assert "".join(e["payload"]["text"] for e in events[1:-1]) == complete["text"]
    assert complete["usage"]["calls"] == 1
    assert gw.until("session.info")[-1]["payload"]["stored_session_id"] == stored
    rows = rest.get(f"/api/sessions/{stored}/messages", headers=hermes.auth_headers()).json()["messages"]
    assert [(r["role"], r["content"], r["finish_reason"]) for r in rows] == [
        ("user", "hello marker-1", None),
        ("assistant", "echo: hello marker-1", "stop"),
    ]
    assert hermes.prompt_count("marker-1") == 1
    assert gw.result("session.history", session_id=rid)["count"] == 2
    assert gw.result("session.usage", session_id=rid)["calls"] == 1
    assert gw.result("session.close", session_id=rid) == {"closed": True}
    assert gw.result("session.close", session_id=rid) == {"closed": False}


def test_replies_are_scripted_per_prompt(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    hermes.reply_for("weather", "It is sunny.")
    gw = gateway()
    rid = gw.result("session.create")["session_id"]
    gw.result("prompt.submit", session_id=rid, text="what is the weather?")
    assert gw.until("message.complete")[-1]["payload"]["text"] == "It is sunny."


def test_resume_of_a_live_running_session_reattaches_it(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    slow_turns(hermes)
    first = gateway()
    created = first.result("session.create")
    rid, stored = created["session_id"], created["stored_session_id"]
    first.result("prompt.submit", session_id=rid, text="long job marker-2")
    first.until("message.start")
    first.close()
    hermes.wait_for(lambda: (s := hermes.session(rid)) is not None and not s.attached)

    second = gateway()
    resumed = second.result("session.resume", session_id=stored)
    assert (resumed["session_id"], resumed["running"], resumed["status"]) == (rid, True, "working")
    assert resumed["inflight"]["user"] == "long job marker-2"
    assert resumed["messages"] == []
    complete = second.until("message.complete")[-1]
    assert (complete["session_id"], complete["payload"]["status"]) == (rid, "complete")
    assert hermes.prompt_count("marker-2") == 1
    assert [r["role"] for r in hermes.transcript(stored)] == ["user", "assistant"]


def test_interrupt_ends_the_turn_as_interrupted_without_a_reply_row(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    slow_turns(hermes)
    gw = gateway()
    created = gw.result("session.create")
    rid = created["session_id"]
    gw.result("prompt.submit", session_id=rid, text="stop me")
    gw.until("message.start")
    assert gw.result("session.interrupt", session_id=rid) == {"status": "interrupted"}
    assert gw.until("message.complete")[-1]["payload"]["status"] == "interrupted"
    assert [r["role"] for r in hermes.transcript(created["stored_session_id"])] == ["user"]
    assert [t.status for t in hermes.turns()] == ["interrupted"]


def test_a_prompt_on_a_running_session_is_queued_and_interrupts_the_live_turn(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    slow_turns(hermes)
    gw = gateway()
    created = gw.result("session.create")
    rid = created["session_id"]
    gw.result("prompt.submit", session_id=rid, text="first m1")
    gw.until("message.start")
    assert gw.result("prompt.submit", session_id=rid, text="second m2") == {"status": "queued"}
    assert gw.until("message.complete")[-1]["payload"]["status"] == "interrupted"
    assert gw.until("message.complete")[-1]["payload"]["text"] == "echo: second m2"
    rows = hermes.transcript(created["stored_session_id"])
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "first m1"),
        ("user", "second m2"),
        ("assistant", "echo: second m2"),
    ]


def test_active_list_shows_every_live_session_of_the_process(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    one, two = gateway(), gateway()
    mine = one.result("session.create")["session_id"]
    theirs = two.result("session.create", profile="work")["session_id"]
    listed = one.result("session.active_list", current_session_id=mine, profile="default")["sessions"]
    assert [(s["id"], s["current"]) for s in listed] == [(mine, True), (theirs, False)]
    assert {"status", "session_key", "started_at", "last_active", "message_count"} <= set(listed[0])


def test_close_on_disconnect_closes_at_once_and_others_are_reaped_when_idle(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    hermes.knobs.reap_grace = 0.3
    gw = gateway()
    closing = gw.result("session.create", close_on_disconnect=True)["session_id"]
    kept = gw.result("session.create", close_on_disconnect=False)["session_id"]
    gw.close()
    hermes.wait_for(lambda: hermes.session(closing) is None)
    view = hermes.session(kept)
    assert view is not None and not view.attached
    hermes.wait_for(lambda: hermes.session(kept) is None)


def test_a_detached_running_turn_goes_on_and_outlives_the_reap_check(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    hermes.knobs.reap_grace = 0.1
    slow_turns(hermes, deltas=4, delay=0.15)
    gw = gateway()
    created = gw.result("session.create")
    rid = created["session_id"]
    gw.result("prompt.submit", session_id=rid, text="keep going")
    gw.until("message.start")
    gw.close()
    hermes.wait_for(lambda: hermes.turns()[0].status == "complete")
    assert [r["role"] for r in hermes.transcript(created["stored_session_id"])] == ["user", "assistant"]
    assert hermes.session(rid) is not None  # the reap check ran once, while the turn was running


def test_error_codes(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    gw = gateway()
    assert gw.error("profiles.list")[0] == -32601
    assert gw.error("prompt.submit", session_id="deadbeef", text="x")[0] == 4001
    assert gw.error("session.interrupt", session_id="deadbeef")[0] == 4001
    assert gw.error("session.resume", session_id="20000101_000000_abcdef")[0] == 4007
    assert gw.error("clarify.respond", request_id="nope", answer="x")[0] == 4009
    gw.ws.send("{not json")
    assert gw.frame()["error"]["code"] == -32700
    hermes.knobs.max_sessions = 1
    gw.result("session.create")
    assert gw.error("session.create")[0] == 4090


def test_named_profiles_store_their_transcripts_apart(
    hermes: HermesFixture, gateway: Callable[..., Gateway], rest: httpx.Client
) -> None:
    gw = gateway()
    created = gw.result("session.create", profile="work")
    assert created["info"]["profile_name"] == "default"  # the 0.19.0 quirk
    rid, stored = created["session_id"], created["stored_session_id"]
    gw.result("prompt.submit", session_id=rid, text="in work")
    gw.until("message.complete")
    auth = hermes.auth_headers()
    work = rest.get(f"/api/sessions/{stored}/messages", params={"profile": "work"}, headers=auth).json()
    assert len(work["messages"]) == 2
    stub = rest.get(f"/api/sessions/{stored}/messages", headers=auth).json()
    assert stub["messages"] == []
    assert gw.result("session.history", session_id=rid)["count"] == 0
    unknown = gw.result("session.create", profile="nobody")
    view = hermes.session(unknown["session_id"])
    assert view is not None and view.profile == "default"


def test_clarify_and_approval_requests_wait_for_their_answers(
    hermes: HermesFixture, gateway: Callable[..., Gateway]
) -> None:
    hermes.clarify_for("ask me", "Which colour?", ["red", "blue"])
    hermes.approval_for("dangerous")
    gw = gateway()
    rid = gw.result("session.create")["session_id"]
    gw.result("prompt.submit", session_id=rid, text="please ask me")
    request = gw.until("clarify.request")[-1]["payload"]
    assert (request["question"], request["choices"]) == ("Which colour?", ["red", "blue"])
    listed = gw.result("session.active_list", current_session_id=rid)["sessions"]
    assert listed[0]["status"] == "waiting"
    assert gw.result("clarify.respond", request_id=request["request_id"], answer="blue") == {"status": "ok"}
    assert gw.until("message.complete")[-1]["payload"]["status"] == "complete"
    assert hermes.clarify_answers()[0]["answer"] == "blue"

    gw.result("prompt.submit", session_id=rid, text="something dangerous")
    assert gw.until("approval.request")[-1]["payload"]["choices"] == ["once", "session", "always", "deny"]
    assert gw.result("approval.respond", session_id=rid, choice="once") == {"resolved": 1}
    assert gw.until("message.complete")[-1]["payload"]["status"] == "complete"


def test_steer_and_attachments(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    gw = gateway()
    rid = gw.result("session.create")["session_id"]
    gw.until("session.info")
    assert gw.result("session.steer", session_id=rid, text="also this") == {"status": "queued", "text": "also this"}
    assert gw.error("session.steer", session_id=rid, text=" ")[0] == 4002
    image = gw.result("image.attach_bytes", session_id=rid, content_base64=base64.b64encode(PNG).decode())
    assert image["attached"] is True and Path(image["path"]).read_bytes() == PNG
    assert gw.error("image.attach_bytes", session_id=rid, content_base64="@@@")[0] == 4017
    data_url = "data:text/plain;base64," + base64.b64encode(b"notes").decode()
    attached = gw.result("file.attach", session_id=rid, data_url=data_url, name="notes.txt")
    assert attached["uploaded"] is True and attached["ref_text"].startswith("@file:")
    assert Path(attached["path"]).read_bytes() == b"notes"
    assert [a["kind"] for a in hermes.attachments()] == ["image", "file"]


def test_compression_moves_the_stored_id_and_rest_follows_it(
    hermes: HermesFixture, gateway: Callable[..., Gateway], rest: httpx.Client
) -> None:
    hermes.compress_on("squash")
    gw = gateway()
    created = gw.result("session.create")
    rid, old = created["session_id"], created["stored_session_id"]
    gw.result("prompt.submit", session_id=rid, text="first")
    gw.until("message.complete")
    gw.result("prompt.submit", session_id=rid, text="squash now")
    gw.until("message.complete")
    new = gw.until("session.info")[-1]["payload"]["stored_session_id"]
    assert new != old
    body = rest.get(f"/api/sessions/{old}/messages", headers=hermes.auth_headers()).json()
    assert body["session_id"] == new
    assert [r["content"] for r in body["messages"]] == ["squash now", "echo: squash now"]
    assert gw.result("session.resume", session_id=old)["session_id"] == rid


# --- plugin routes ---------------------------------------------------------------------------------------------


def bind_body(rid: str, stored: str, generation: str = "work-1:grant-1") -> dict[str, Any]:
    return {
        "native_tools": True,
        "session_id": rid,
        "stored_session_id": stored,
        "profile": "default",
        "generation": generation,
        "bridge_url": "http://127.0.0.1:45678",
        "token": "b" * 43,
        "expires_at": int(time.time() * 1000) + 600_000,
    }


def test_capabilities_bind_and_unbind(
    hermes: HermesFixture, gateway: Callable[..., Gateway], rest: httpx.Client
) -> None:
    auth = hermes.auth_headers()
    caps = rest.get("/api/plugins/talaria/capabilities", params={"profile": "default"}, headers=auth).json()
    assert {k: caps[k] for k in ("version", "ready", "in_process", "native_tools")} == {
        "version": 1,
        "ready": True,
        "in_process": True,
        "native_tools": True,
    }
    gw = gateway()
    created = gw.result("session.create")
    rid, stored = created["session_id"], created["stored_session_id"]
    bound = rest.post("/api/plugins/talaria/bind", json=bind_body(rid, stored), headers=auth)
    assert bound.status_code == 200
    assert (bound.json()["ok"], bound.json()["native_tools"]) == (True, True)
    assert hermes.bindings()[rid]["generation"] == "work-1:grant-1"
    mismatch = rest.post("/api/plugins/talaria/bind", json=bind_body(rid, "20000101_000000_abcdef"), headers=auth)
    assert (mismatch.status_code, mismatch.json()["code"]) == (409, "stored_session_mismatch")
    assert len(hermes.binds()) == 2

    slow_turns(hermes)
    gw.result("prompt.submit", session_id=rid, text="busy")
    gw.until("message.start")
    again = rest.post("/api/plugins/talaria/bind", json=bind_body(rid, stored), headers=auth)
    assert again.status_code == 200  # renewing the same generation mid-turn
    other = rest.post("/api/plugins/talaria/bind", json=bind_body(rid, stored, "work-1:grant-2"), headers=auth)
    assert (other.status_code, other.json()["code"]) == (409, "session_running")

    unbind = {"session_id": rid, "generation": "work-1:grant-1"}
    assert rest.post("/api/plugins/talaria/unbind", json=unbind, headers=auth).json() == {"ok": True, "removed": 1}
    assert rest.post("/api/plugins/talaria/unbind", json=unbind, headers=auth).json() == {"ok": True, "removed": 0}
    assert hermes.unbinds() == [unbind, unbind]


def test_plugin_knobs(hermes: HermesFixture, rest: httpx.Client) -> None:
    auth = hermes.auth_headers()
    hermes.knobs.capabilities = {**hermes.knobs.capabilities, "ready": False, "missing": ["_sessions"]}
    caps = rest.get("/api/plugins/talaria/capabilities", headers=auth).json()
    assert (caps["ready"], caps["missing"]) == (False, ["_sessions"])
    hermes.fail_route("/api/plugins/talaria/bind", 500, {"ok": False, "error": "boom", "code": "internal"}, times=1)
    assert rest.post("/api/plugins/talaria/bind", json={}, headers=auth).status_code == 500
    assert rest.post("/api/plugins/talaria/bind", json={}, headers=auth).status_code == 400
    hermes.knobs.plugin_enabled = False
    missing = rest.get("/api/plugins/talaria/capabilities", headers=auth)
    assert (missing.status_code, missing.json()) == (404, {"detail": "Plugin not found"})
    assert rest.get("/api/plugins/talaria/capabilities").status_code == 401


# --- knobs -----------------------------------------------------------------------------------------------------


def test_gateway_ready_can_be_slow_or_never_sent(hermes: HermesFixture) -> None:
    hermes.knobs.ready_delay = 0.3
    started = time.monotonic()
    gw = Gateway(hermes)
    try:
        assert time.monotonic() - started >= 0.25
    finally:
        gw.close()
    hermes.knobs.send_ready = False
    silent = Gateway(hermes, wait_ready=False)
    try:
        rid = silent.send("session.active_list")
        assert silent.frame()["id"] == rid  # the first frame is the answer: no gateway.ready
    finally:
        silent.close()


def test_dropped_connections(hermes: HermesFixture) -> None:
    hermes.knobs.drop_after_frames = 2
    gw = Gateway(hermes)
    try:
        kept = gw.result("session.create")["session_id"]
        with pytest.raises(ConnectionClosed) as caught:
            gw.frame()
        assert caught.value.rcvd is None  # aborted: no close frame
    finally:
        gw.close()
    hermes.wait_for(lambda: (s := hermes.session(kept)) is not None and not s.attached)

    hermes.knobs.drop_after_frames = None
    hermes.drop_on_method("prompt.submit")
    gw = Gateway(hermes)
    try:
        rid = gw.result("session.create")["session_id"]
        gw.send("prompt.submit", session_id=rid, text="lost answer marker-3")
        with pytest.raises(ConnectionClosed):
            gw.until("message.complete")
    finally:
        gw.close()
    hermes.wait_for(lambda: hermes.prompt_count("marker-3") == 1)  # it ran; only its answer was lost

    hermes.drop_on_method("prompt.submit", after_handling=False)
    gw = Gateway(hermes)
    try:
        rid = gw.result("session.create")["session_id"]
        gw.send("prompt.submit", session_id=rid, text="never ran marker-4")
        with pytest.raises(ConnectionClosed):
            gw.until("message.complete")
    finally:
        gw.close()
    assert hermes.prompt_count("marker-4") == 0
    assert len(hermes.rpc_requests("prompt.submit")) == 2


def test_drop_connections_mid_turn_then_recover(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    slow_turns(hermes, deltas=3, delay=0.1)
    gw = gateway()
    created = gw.result("session.create")
    gw.result("prompt.submit", session_id=created["session_id"], text="survive marker-5")
    gw.until("message.start")
    assert hermes.drop_connections() == 1
    hermes.wait_for(lambda: hermes.turns()[0].status == "complete")
    resumed = gateway().result("session.resume", session_id=created["stored_session_id"])
    assert (resumed["session_id"], resumed["running"]) == (created["session_id"], False)
    assert [m["role"] for m in resumed["messages"]] == ["user", "assistant"]


def test_failing_and_slow_methods(hermes: HermesFixture, gateway: Callable[..., Gateway]) -> None:
    hermes.fail_method("session.create", 5000, "boom", times=1)
    gw = gateway()
    assert gw.error("session.create") == (5000, "boom")
    rid = gw.result("session.create")["session_id"]
    hermes.delay_method("session.usage", 0.3)
    slow = gw.send("session.usage", session_id=rid)
    fast = gw.send("session.active_list")
    assert "result" in gw.response(fast)
    assert slow not in gw.responses  # answered out of order
    assert gw.response(slow)["result"]["calls"] == 0
    hermes.delay_method("session.close", None)
    gw.send("session.close", session_id=rid)
    assert gw.result("session.active_list")["sessions"][0]["id"] == rid  # never ran, never answered


def test_rest_failures_and_slowness(hermes: HermesFixture, rest: httpx.Client) -> None:
    auth = hermes.auth_headers()
    hermes.fail_route("/api/profiles", 503, times=1)
    assert rest.get("/api/profiles", headers=auth).status_code == 503
    assert rest.get("/api/profiles", headers=auth).status_code == 200
    hermes.delay_route("/api/status", 0.3, times=1)
    started = time.monotonic()
    assert rest.get("/api/status").status_code == 200
    assert time.monotonic() - started >= 0.25
    hermes.knobs.status_overrides = {"version": "0.20.0"}
    assert rest.get("/api/status").json()["version"] == "0.20.0"
    hermes.reset_knobs()
    assert rest.get("/api/status").json()["version"] == "0.19.0"


def test_restart_ends_live_sessions_and_mints_a_new_token(hermes: HermesFixture, rest: httpx.Client) -> None:
    old_token = hermes.session_token
    gw = Gateway(hermes)
    try:
        created = gw.result("session.create")
        gw.result("prompt.submit", session_id=created["session_id"], text="before restart")
        gw.until("message.complete")
        hermes.restart()
        with pytest.raises(ConnectionClosed) as caught:
            while True:
                gw.frame()
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1012
    finally:
        gw.close()
    assert hermes.session_token != old_token
    assert rest.get("/api/profiles", headers={"X-Hermes-Session-Token": old_token}).status_code == 401
    fresh = Gateway(hermes)
    try:
        assert fresh.error("session.usage", session_id=created["session_id"])[0] == 4001
        resumed = fresh.result("session.resume", session_id=created["stored_session_id"])
        assert resumed["session_id"] != created["session_id"]
        assert resumed["message_count"] == 2
    finally:
        fresh.close()


def test_wait_for_times_out(hermes: HermesFixture) -> None:
    with pytest.raises(TimeoutError):
        hermes.wait_for(lambda: hermes.prompt_count("never") == 1, timeout=0.1)


def test_knobs_can_be_given_to_the_constructor() -> None:
    with HermesFixture(knobs=Knobs(delta_count=1), session_token="t" * 43) as fixture:
        gw = Gateway(fixture)
        try:
            rid = gw.result("session.create")["session_id"]
            gw.result("prompt.submit", session_id=rid, text="one piece")
            streamed = [t for t in types(gw.until("message.complete")) if t != "session.info"]
            assert streamed == ["message.start", "message.delta", "message.complete"]
        finally:
            gw.close()
        fixture.knobs.delta_count = 7
        fixture.reset_knobs()
        assert fixture.knobs.delta_count == 1
        fixture.restart()
        assert (fixture.session_token, fixture.restarts) == ("t" * 43, 1)
