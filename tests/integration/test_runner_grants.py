"""Team-tool grants over real sockets (runner-protocol.md 12): a real hub (SystemClock) in a thread, the Hermes
fixture, and the runner side made of a real ``HubClient``, ``Executor``, ``Receipts`` and ``Grants``.

Hub operations run on the hub's loop (``HubServer.call`` in a worker thread); the runner side runs on the test's
loop. The Hermes sessions that grants bind to are created over the fixture's ``/api/ws``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from talaria.clock import ManualClock, SystemClock
from talaria.errors import TalariaError
from talaria.hermes.rest import HermesRest
from talaria.hub.runners.connection_state import AccountRef, Grant
from talaria.hub.runners.registry import parse_registration
from talaria.runner.config import RunnerConfig, parse_config
from talaria.runner.errors import CommandError
from talaria.runner.executor import Executor
from talaria.runner.grant_listener import MAX_BODY_BYTES, ToolListener
from talaria.runner.grant_tools import ToolCalls, opaque_tool_id
from talaria.runner.grants import Grant as RunnerGrant
from talaria.runner.grants import Grants
from talaria.runner.hub_client import HubClient, HubError, Identity
from talaria.runner.receipts import Receipts
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account

T = TypeVar("T")
CATALOG = [
    {"id": "form_team", "name": "form_team", "description": "Form a team", "inputSchema": {"type": "object"}},
    {"id": "report_back", "name": "report_back", "description": "Report back", "inputSchema": {"type": "object"}},
]
THIRTY_MINUTES_MS = 30 * 60 * 1000


# --- the pieces ------------------------------------------------------------------------------------------------


class Owned:
    """The gateway's answer for owned sessions, as the grants see it."""

    def __init__(self) -> None:
        self.sessions: dict[str, str] = {}
        self.stored: dict[str, str] = {}

    def profile_of(self, runtime_id: str) -> str | None:
        return self.sessions.get(runtime_id)

    def stored_of(self, runtime_id: str) -> str | None:
        return self.stored.get(runtime_id)


class HermesSession:
    """One live session in the fixture, created over ``/api/ws`` and kept open."""

    def __init__(self, hermes: HermesFixture, profile: str = "default") -> None:
        self.ws: ClientConnection = connect(
            hermes.ws_url, proxy=None, origin=hermes.origin, open_timeout=5, legacy=True
        )  # type: ignore[arg-type]
        assert json.loads(self.ws.recv(timeout=5))["params"]["type"] == "gateway.ready"
        params: dict[str, Any] = {"close_on_disconnect": False} | ({} if profile == "default" else {"profile": profile})
        self.ws.send(json.dumps({"jsonrpc": "2.0", "id": "1", "method": "session.create", "params": params}))
        while True:
            frame = json.loads(self.ws.recv(timeout=5))
            if frame.get("id") == "1":
                break
        self.runtime_id: str = frame["result"]["session_id"]
        self.stored_id: str = frame["result"]["stored_session_id"]
        self.profile = profile

    @property
    def payload(self) -> dict[str, str]:
        return {"runtimeId": self.runtime_id, "storedId": self.stored_id}

    def close(self) -> None:
        self.ws.close()


class Runner:
    """The runner side: a real HubClient polling the real hub, the real Executor and Grants."""

    def __init__(self, config: RunnerConfig, state: Path, owned: Owned, grants_class: type[Grants] = Grants) -> None:
        self.clock = SystemClock()
        self.hub = HubClient(config.server_url, Identity(config.runner_id, config.token, str(uuid.uuid4())))
        self.receipts = Receipts(state / f"receipts-{uuid.uuid4()}.sqlite3", self.clock)
        self.rest = HermesRest(config.hermes_url, token_file=config.hermes_token_file, clock=self.clock)
        self.epoch: str | None = None
        self.grants = grants_class(
            config,
            self.hub,
            lambda: self.rest,
            self.clock,
            owned,
            lambda: self.epoch,
            stored_of=owned.stored_of,
            record_session=self.receipts.record_session,
        )
        self.executor = Executor(
            self.hub,
            self.receipts,
            self.clock,
            handlers=self.grants.handlers(),
            epoch_is_current=lambda epoch: epoch == self.epoch,
            on_hub_error=self._hub_error,
        )
        self.connected = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    async def _hub_error(self, exc: HubError) -> None:
        raise AssertionError(f"unexpected hub error {exc.code}")

    async def _run(self) -> None:
        reset = True
        while True:
            answer = await self.hub.poll(reset=reset, features=["team-tools-v1"])
            reset = False
            if answer["epoch"] != self.epoch:
                await self.grants.dispose_all()
                self.epoch = answer["epoch"]
                self.connected.set()
            for command in answer["commands"]:
                self.executor.submit(command, answer["epoch"])

    async def __aenter__(self) -> Runner:
        self._loop = asyncio.get_running_loop().create_task(self._run())
        await asyncio.wait_for(self.connected.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.cancel()
        with contextlib.suppress(asyncio.CancelledError, HubError):
            await self._loop
        await self.executor.drain(5)
        self.executor.cancel_all()
        await self.grants.dispose_all()
        await self.hub.close()
        await self.rest.close()
        self.receipts.close()


class Env:
    def __init__(self, hub: HubServer, hermes: HermesFixture, config: RunnerConfig, account: AccountRef) -> None:
        self.hub = hub
        self.hermes = hermes
        self.config = config
        self.account = account
        self.runner_id = config.runner_id

    async def on_hub(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.to_thread(self.hub.call, coro, 60)

    async def create_grant(self, session: HermesSession, executor: Any, *, work_id: str = "work-1") -> Grant:
        return await self.on_hub(
            self.hub.hub.channels.create_grant(
                self.runner_id,
                self.account,
                profile=session.profile,
                work_id=work_id,
                session=session.payload,
                catalog=CATALOG,
                executor=executor,
                turn_active=lambda: True,
            )
        )

    async def hub_grants(self) -> list[Grant]:
        async def read() -> list[Grant]:
            state = self.hub.hub.runners.state_of(self.runner_id)
            return list(state.grants.values()) if state is not None else []

        return await self.on_hub(read())


@pytest.fixture
def hermes() -> Iterator[HermesFixture]:
    with HermesFixture(profiles=["default", "work"]) as fixture:
        yield fixture


@pytest.fixture
def env(tmp_path: Path, hermes: HermesFixture) -> Iterator[Env]:
    hub = HubServer(tmp_path / "data", SystemClock()).start()
    try:
        add_account(hub, "alice", allowed_profiles={"local": ["default", "work"]})
        fields = parse_registration(
            {"name": "node", "allowedProfiles": ["default", "work"], "hermesURL": hermes.url},
            default_server_url=hub.url,
        )
        registration = hub.hub.registry.register("default", fields)
        token_file = tmp_path / "hermes-token"
        token_file.write_text(hermes.session_token)
        token_file.chmod(0o600)
        config = parse_config(registration.config | {"hermesTokenFile": str(token_file)})
        account = hub.hub.accounts.get("alice")
        assert account is not None
        yield Env(hub, hermes, config, AccountRef("alice", account.tenant, account.auth_version))
    finally:
        hub.stop()


@pytest.fixture
def session(hermes: HermesFixture) -> Iterator[HermesSession]:
    live = HermesSession(hermes)
    yield live
    live.close()


def owned_by(session: HermesSession) -> Owned:
    owned = Owned()
    owned.sessions[session.runtime_id] = session.profile
    owned.stored[session.runtime_id] = session.stored_id
    return owned


@contextlib.asynccontextmanager
async def listener_client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        yield client


async def post(client: httpx.AsyncClient, bind: dict[str, Any], path: str, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {bind['token']}"}
    return await client.post(f"{bind['bridge_url']}{path}", json=body, headers=headers)


def refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def error_code(answer: dict[str, Any]) -> str:
    assert answer.get("isError") is True, answer
    return str(json.loads(answer["content"][0]["text"])["code"])


# --- through the hub -------------------------------------------------------------------------------------------


def test_bind_posts_the_plugin_body_and_close_unbinds(
    env: Env, session: HermesSession, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[Any] = []

    async def executor(tool_id: str, arguments: dict[str, Any]) -> Any:
        calls.append(tool_id)
        return {}

    async def scenario() -> None:
        async with Runner(env.config, env.hub.data_dir, owned_by(session)) as runner:
            grant = await env.create_grant(session, executor)
            assert runner.grants.open_ids() == [grant.id]
            port = runner.grants.listener_port(grant.id)
            assert port is not None
            before = time.time() * 1000
            expires = await env.on_hub(env.hub.hub.channels.bind_grant(grant, session.payload))
            after = time.time() * 1000
            [capabilities] = env.hermes.requests(path="/api/plugins/talaria/capabilities")
            assert capabilities.query == {"profile": "default"}
            [bound] = env.hermes.binds()
            assert set(bound) == {
                "native_tools", "session_id", "stored_session_id", "profile", "generation", "bridge_url", "token",
                "expires_at",
            }  # fmt: skip
            assert bound["native_tools"] is True
            assert (bound["session_id"], bound["stored_session_id"]) == (session.runtime_id, session.stored_id)
            assert bound["profile"] == "default"
            assert re.fullmatch(
                r"work-1:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", bound["generation"]
            )
            assert bound["bridge_url"] == f"http://127.0.0.1:{port}"
            assert isinstance(bound["token"], str) and len(bound["token"]) == 43
            assert bound["expires_at"] == expires
            assert before + THIRTY_MINUTES_MS <= expires <= after + THIRTY_MINUTES_MS
            assert runner.receipts.session_profile(session.stored_id) == "default"  # section 11.2
            assert env.hermes.bindings()[session.runtime_id]["generation"] == bound["generation"]

            # renewal: no second capabilities probe, same generation
            await env.on_hub(env.hub.hub.channels.bind_grant(grant, session.payload))
            assert len(env.hermes.requests(path="/api/plugins/talaria/capabilities")) == 1
            assert [b["generation"] for b in env.hermes.binds()] == [bound["generation"]] * 2

            await env.on_hub(env.hub.hub.channels.close_grant(grant))
            assert env.hermes.unbinds() == [{"session_id": session.runtime_id, "generation": bound["generation"]}]
            assert env.hermes.bindings() == {}
            assert runner.grants.open_ids() == [] and refused(port)
            with pytest.raises(TalariaError) as caught:
                await env.on_hub(env.hub.hub.channels.bind_grant(grant, session.payload))
            assert caught.value.code == "runner_grant_expired"
        assert calls == []

    asyncio.run(scenario())
    token = env.hermes.binds()[0]["token"]
    assert token not in caplog.text  # the grant bearer reaches Hermes only


def test_a_call_through_the_listener_reaches_the_hub_executor_once(env: Env, session: HermesSession) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def executor(tool_id: str, arguments: dict[str, Any]) -> Any:
        calls.append((tool_id, arguments))
        await asyncio.sleep(0.05)  # duplicates arrive while the first call runs
        return {"team": "formed", "size": arguments["size"]}

    async def scenario() -> None:
        async with Runner(env.config, env.hub.data_dir, owned_by(session)) as runner, listener_client() as client:
            grant = await env.create_grant(session, executor)
            await env.on_hub(env.hub.hub.channels.bind_grant(grant, session.payload))
            bind = env.hermes.binds()[-1]
            listing = await post(client, bind, "/tools/list", {})
            assert listing.status_code == 200 and listing.headers["cache-control"] == "no-store"
            tools = {tool["name"]: tool["id"] for tool in listing.json()["tools"]}
            assert tools == {name: opaque_tool_id(bind["token"], name) for name in ("form_team", "report_back")}
            assert listing.json()["warnings"] == []

            call = {"toolId": tools["form_team"], "arguments": {"size": 3}, "callId": "call-1"}
            answers = await asyncio.gather(*(post(client, bind, "/tools/call", call) for _ in range(3)))
            again = await post(client, bind, "/tools/call", call)
            expected = {"content": [{"type": "text", "text": '{"size":3,"team":"formed"}'}],
                        "structuredContent": {"team": "formed", "size": 3}}  # fmt: skip
            assert [a.status_code for a in [*answers, again]] == [200] * 4
            assert all(a.json() == expected for a in [*answers, again])
            assert calls == [("form_team", {"size": 3})]  # the real id, once

            conflict = await post(client, bind, "/tools/call", call | {"arguments": {"size": 4}})
            assert conflict.status_code == 200 and error_code(conflict.json()) == "idempotency_conflict"
            unknown = await post(client, bind, "/tools/call", call | {"toolId": "form_team", "callId": "call-2"})
            assert error_code(unknown.json()) == "not_found"
            failing = await post(
                client, bind, "/tools/call", {"toolId": tools["report_back"], "arguments": {}, "callId": "c3"}
            )
            assert error_code(failing.json()) == "internal_error"  # the executor's KeyError, as the hub reports it
            assert len(calls) == 2
            assert runner.grants.open_ids() == [grant.id]

    asyncio.run(scenario())


def test_revocation_stops_the_listener_and_fails_waiting_calls(env: Env, session: HermesSession) -> None:
    release = threading.Event()
    started = threading.Event()

    async def executor(tool_id: str, arguments: dict[str, Any]) -> Any:
        started.set()
        await asyncio.to_thread(release.wait, 20)
        return {"late": True}

    async def scenario() -> None:
        async with Runner(env.config, env.hub.data_dir, owned_by(session)) as runner, listener_client() as client:
            grant = await env.create_grant(session, executor)
            await env.on_hub(env.hub.hub.channels.bind_grant(grant, session.payload))
            bind = env.hermes.binds()[-1]
            port = runner.grants.listener_port(grant.id)
            assert port is not None
            tool = opaque_tool_id(bind["token"], "form_team")
            waiting = asyncio.ensure_future(
                post(client, bind, "/tools/call", {"toolId": tool, "arguments": {}, "callId": "slow"})
            )
            await asyncio.to_thread(started.wait, 10)
            await env.on_hub(env.hub.hub.channels.close_grant(grant))  # revocation on the hub
            answer = await asyncio.wait_for(waiting, 10)
            assert answer.status_code == 200 and error_code(answer.json()) == "runner_grant_expired"
            assert refused(port)
            with pytest.raises(httpx.ConnectError):
                await post(client, bind, "/tools/call", {"toolId": tool, "arguments": {}, "callId": "after"})
            assert runner.grants.open_ids() == [] and runner.grants.tombstoned(grant.id)
            assert env.hermes.unbinds()[-1]["generation"] == bind["generation"]

    try:
        asyncio.run(scenario())
    finally:
        release.set()


class GatedGrants(Grants):
    """Grants whose listener start waits for the test: a window in which a close can overtake a creation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.ports: list[int] = []

    async def _start_listener(self, grant: RunnerGrant) -> ToolListener:
        self.entered.set()
        await self.gate.wait()
        listener = await super()._start_listener(grant)
        self.ports.append(listener.port)
        return listener


def test_a_close_that_overtakes_an_admitted_creation_leaves_no_grant(env: Env, session: HermesSession) -> None:
    async def executor(tool_id: str, arguments: dict[str, Any]) -> Any:
        return {}

    async def scenario() -> None:
        async with Runner(env.config, env.hub.data_dir, owned_by(session), GatedGrants) as runner:
            grants = runner.grants
            assert isinstance(grants, GatedGrants)
            creating = asyncio.ensure_future(env.create_grant(session, executor))
            await asyncio.wait_for(grants.entered.wait(), 10)  # admitted by the hub, now creating
            [hub_grant] = await env.hub_grants()
            assert grants.open_ids() == [hub_grant.id]
            await env.on_hub(env.hub.hub.channels.close_grant(hub_grant))  # the close overtakes the creation
            assert grants.open_ids() == [] and grants.tombstoned(hub_grant.id)
            grants.gate.set()
            with pytest.raises(TalariaError) as caught:
                await asyncio.wait_for(creating, 10)
            assert caught.value.code == "runner_grant_expired"
            assert grants.open_ids() == [] and await env.hub_grants() == []
            [port] = grants.ports
            assert refused(port)
            assert env.hermes.binds() == [] and env.hermes.unbinds() == []  # never bound: nothing to unbind

    asyncio.run(scenario())


# --- Grants directly (no hub needed for these) -----------------------------------------------------------------


def direct_grants(env: Env, owned: Owned, clock: Any = None, grants_class: type[Grants] = Grants) -> Grants:
    rest = HermesRest(env.config.hermes_url, token_file=env.config.hermes_token_file, clock=SystemClock())
    hub = HubClient(env.config.server_url, Identity(env.config.runner_id, env.config.token, str(uuid.uuid4())))
    grants = grants_class(
        env.config, hub, lambda: rest, clock or SystemClock(), owned, lambda: "epoch", stored_of=owned.stored_of
    )
    grants.closers = [rest.close, hub.close]  # type: ignore[attr-defined]
    return grants


async def shut(grants: Grants) -> None:
    await grants.dispose_all()
    for close in grants.closers:  # type: ignore[attr-defined]
        await close()


def create(grant_id: str, session: HermesSession, **payload: Any) -> dict[str, Any]:
    body = {
        "grantId": grant_id,
        "profile": session.profile,
        "workId": "w",
        "session": session.payload,
        "catalog": CATALOG,
    }
    return {"id": str(uuid.uuid4()), "kind": "grant.create", "payload": body | payload}


def bind(grant_id: str, session: dict[str, str]) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "kind": "grant.bind", "payload": {"grantId": grant_id, "session": session}}


async def code_of(awaitable: Coroutine[Any, Any, Any]) -> str:
    with pytest.raises(CommandError) as caught:
        await awaitable
    return caught.value.code


def test_a_local_disconnect_that_overtakes_a_creation_leaves_no_grant(env: Env, session: HermesSession) -> None:
    async def scenario() -> None:
        grants = direct_grants(env, owned_by(session), grants_class=GatedGrants)
        assert isinstance(grants, GatedGrants)
        gid = str(uuid.uuid4())
        creating = asyncio.ensure_future(grants.handlers()["grant.create"](create(gid, session)))
        await grants.entered.wait()
        await grants.dispose_all()
        grants.gate.set()
        assert await code_of(creating) == "runner_grant_expired"
        assert grants.open_ids() == [] and grants.tombstoned(gid) and refused(grants.ports[0])
        await shut(grants)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("knob", "value", "code"),
    [
        (
            "capabilities",
            {"version": 1, "ready": False, "in_process": True, "native_tools": True},
            "team_tools_unavailable",
        ),
        (
            "capabilities",
            {"version": 2, "ready": True, "in_process": True, "native_tools": True},
            "team_tools_unavailable",
        ),
        (
            "capabilities",
            {"version": 1, "ready": True, "in_process": False, "native_tools": True},
            "team_tools_unavailable",
        ),
        ("plugin_enabled", False, "team_tools_unavailable"),
        ("bind_native_tools", False, "team_tools_unavailable"),
    ],
)
def test_the_first_bind_needs_a_ready_plugin(
    env: Env, session: HermesSession, knob: str, value: Any, code: str
) -> None:
    setattr(env.hermes.knobs, knob, value)

    async def scenario() -> None:
        grants = direct_grants(env, owned_by(session))
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create(gid, session))
        assert await code_of(grants.handlers()["grant.bind"](bind(gid, session.payload))) == code
        if knob == "bind_native_tools":  # it was bound without native tools: undone
            assert env.hermes.bindings() == {}
            assert len(env.hermes.unbinds()) == 1
        else:
            assert env.hermes.binds() == []
        assert grants.open_ids() == [gid]  # the hub decides what happens to the grant
        await shut(grants)

    asyncio.run(scenario())


def test_bind_rules(env: Env, session: HermesSession, hermes: HermesFixture) -> None:
    other = HermesSession(hermes)

    async def scenario() -> None:
        owned = owned_by(session)
        owned.sessions[other.runtime_id] = "default"
        grants = direct_grants(env, owned)
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create(gid, session))
        handler = grants.handlers()["grant.bind"]
        assert await code_of(handler(bind(gid, other.payload))) == "runner_session_forbidden"
        assert await code_of(handler(bind(str(uuid.uuid4()), session.payload))) == "runner_grant_expired"
        assert await code_of(handler({"payload": {"grantId": gid}})) == "runner_command_forbidden"
        # a plugin refusal (wrong stored id, and session.info knows no better) is team_tools_bind_failed
        owned.stored.pop(session.runtime_id)
        stale = {"runtimeId": session.runtime_id, "storedId": "20200101_000000_stale0"}
        assert await code_of(handler(bind(gid, stale))) == "team_tools_bind_failed"
        # the stored id changed during the bind (session.info): bound once more with the new one
        owned.stored[session.runtime_id] = session.stored_id
        answer = await handler(bind(gid, stale))
        assert answer["ok"] is True
        assert [b["stored_session_id"] for b in env.hermes.binds()[-2:]] == [
            "20200101_000000_stale0",
            session.stored_id,
        ]
        # ownership lost: the session's owning connection closed
        owned.sessions.pop(session.runtime_id)
        assert await code_of(handler(bind(gid, session.payload))) == "runner_session_forbidden"
        grants.session_closed(session.runtime_id)
        assert grants.open_ids() == []
        await shut(grants)
        assert env.hermes.unbinds()[-1]["session_id"] == session.runtime_id

    try:
        asyncio.run(scenario())
    finally:
        other.close()


def test_expiry_disposes_and_a_bind_extends(env: Env, session: HermesSession) -> None:
    clock = ManualClock(int(time.time() * 1000) - 120_000)  # behind the fixture's wall clock, which checks expires_at

    async def scenario() -> None:
        grants = direct_grants(env, owned_by(session), clock=clock)
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create(gid, session))
        created = clock.now_ms()
        clock.advance(60)
        answer = await grants.handlers()["grant.bind"](bind(gid, session.payload))
        assert answer == {"ok": True, "expiresAt": created + 60_000 + THIRTY_MINUTES_MS}
        clock.advance(30 * 60 - 0.001)
        assert grants.expire_due() == 0
        clock.advance(0.001)
        port = grants.listener_port(gid)
        assert port is not None
        assert grants.expire_due() == 1
        await grants.dispose_all()
        assert grants.open_ids() == [] and refused(port)
        assert env.hermes.unbinds()[-1]["generation"] == env.hermes.binds()[-1]["generation"]
        await shut(grants)

    asyncio.run(scenario())


# --- the listener's pre-checks over a real socket ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_listener(bearer: str) -> AsyncIterator[tuple[ToolListener, list[str]]]:
    seen: list[str] = []

    async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
        seen.append(call_id)
        return {"ok": True}

    tools = ToolCalls(bearer, CATALOG, forward)
    listener = ToolListener(bearer, tools.serve)
    await listener.start()
    try:
        yield listener, seen
    finally:
        await listener.wait_closed(1)


def test_listener_prechecks_over_a_socket() -> None:
    bearer = "z" * 43

    async def scenario() -> None:
        async with bare_listener(bearer) as (listener, seen), listener_client() as client:
            url = f"{listener.url}/tools/call"
            auth = {"Authorization": f"Bearer {bearer}"}
            tool = opaque_tool_id(bearer, "form_team")
            prefix = json.dumps({"toolId": tool, "callId": "edge", "arguments": {"pad": ""}}).encode()
            edge = prefix[:-3] + b"x" * (MAX_BODY_BYTES - len(prefix)) + prefix[-3:]
            assert len(edge) == MAX_BODY_BYTES
            json_type = {"Content-Type": "application/json"}

            ok = await client.post(url, content=edge, headers=auth | json_type)
            assert ok.status_code == 200 and ok.json()["structuredContent"] == {"ok": True}
            over = await client.post(url, content=edge + b" ", headers=auth | json_type)
            assert (over.status_code, over.json()) == (
                413,
                {"code": "runner_payload_limit", "error": "the body is larger than 256 KiB"},
            )
            assert over.headers["content-type"] == "application/json"
            assert (await client.post(url, json={}, headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await client.post(url, json={}, headers=auth | {"Origin": listener.url})).status_code == 403
            assert (await client.post(url, json={}, headers=auth | {"Host": "localhost"})).status_code == 403
            assert (await client.get(url, headers=auth)).status_code == 405
            plain = await client.post(url, content=b"{}", headers=auth | {"Content-Type": "text/plain"})
            assert (plain.status_code, plain.json()["code"]) == (415, "unsupported_media_type")
            missing = await client.post(f"{listener.url}/nope", json={}, headers=auth)
            assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
            assert seen == ["edge"]

            # a peer other than 127.0.0.1 (another loopback address) is refused first
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port, local_addr=("127.0.0.2", 0))
            writer.write(f"POST /tools/list HTTP/1.1\r\nHost: 127.0.0.1:{listener.port}\r\n\r\n".encode())
            response = await reader.read()
            writer.close()
            assert response.startswith(b"HTTP/1.1 403 ") and b'"peer_not_allowed"' in response
            assert bearer.encode() not in response

    asyncio.run(scenario())


def test_listener_stops_accepting_when_closed() -> None:
    async def scenario() -> None:
        async with bare_listener("y" * 43) as (listener, _):
            port = listener.port
            idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
            listener.close()
            await listener.wait_closed(1)
            assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # dropped, no answer
            idle_writer.close()
            assert refused(port)

    asyncio.run(scenario())
