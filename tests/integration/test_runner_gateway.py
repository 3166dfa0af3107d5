"""Gateway channels end to end over real sockets (runner-protocol.md 5.2, 7.2-7.4, 8, 10): a hub on 127.0.0.1
(SystemClock), the runner as an in-process ``Agent`` on its own event loop and thread, and the Hermes fixture.

The hub side is driven through ``server.hub.channels`` on the hub's loop (``HubServer.call``). The runner's HTTP
transport to the hub is the real one wrapped by ``HubTap``, which records every POST body (results and events) and
can hold ``admit`` requests, so that a command can be queued before, and admitted after, an account change.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.errors import TalariaError
from talaria.hermes.auth import HermesUnavailable
from talaria.hermes.ws import AuthRefused, ChannelClosed, HermesChannel, RpcError, RpcTimeout
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.hub.runners.registry import parse_registration
from talaria.runner import gateway as gateway_module
from talaria.runner.agent import Agent
from talaria.runner.config import RunnerConfig, parse_config
from talaria.runner.hub_client import Wire, hub_wire
from talaria.runner.receipts import Receipts
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from talaria.wire import WireError, WireReply
from tests.conftest import add_account
from tests.tcp_proxy import TcpProxy

T = TypeVar("T")
HUB_PROFILES = ["default", "work", "ghost", "local-off"]  # the runner record and the accounts
RUNNER_PROFILES = ["default", "work", "ghost"]  # runner.json: local-off is refused by the runner itself
HERMES_PROFILES = ["default", "work"]  # ghost is unknown to Hermes


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class HubTap:
    """The runner's wire to the hub: the real one, recording POST bodies, able to hold ``admit``."""

    def __init__(self, inner: Wire) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.hold_admit = threading.Event()
        self.admit_held = threading.Event()
        self.release_admit = threading.Event()
        self.echo = True  # False: poll answers lose X-Hub-Features, as from a hub without failover-v1
        self.lose_event_answers = 0  # the answers of this many next event posts are lost after the hub took them

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        op = target.rsplit("/", 1)[-1]
        if method == "POST":
            with self.lock:
                self.posts.append((op, json.loads(body or b"null")))
        if op == "admit" and self.hold_admit.is_set():
            self.admit_held.set()
            while not self.release_admit.is_set():
                await asyncio.sleep(0.01)
        reply = await self.inner.request(method, target, headers=headers, body=body, timeout=timeout)
        if op == "poll" and not self.echo:
            reply = replace(reply, headers={k: v for k, v in reply.headers.items() if k != "x-hub-features"})
        if op == "event" and self.lose_event_answers > 0:
            self.lose_event_answers -= 1
            raise WireError("closed", "the answer was lost (test)")  # the hub took it; the runner cannot know
        return reply

    async def aclose(self) -> None:
        await self.inner.aclose()

    def bodies(self, op: str) -> list[dict[str, Any]]:
        """The POST bodies of ``op`` in order, an event's ``seq`` left out (``seqs`` has them)."""
        with self.lock:
            return [{k: v for k, v in body.items() if k != "seq"} for name, body in self.posts if name == op]

    def seqs(self, connection_id: str) -> list[int | None]:
        """The ``seq`` of each event post of one connection, retries included."""
        with self.lock:
            return [body.get("seq") for name, body in self.posts
                    if name == "event" and body["connectionId"] == connection_id]  # fmt: skip

    def result_of(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        return [body for body in self.bodies("result") if predicate(body)]


class RunnerThread:
    """An ``Agent`` running on its own event loop in a background thread."""

    def __init__(self, config: RunnerConfig, receipts: Receipts, tap: HubTap, **agent: Any) -> None:
        self.config = config
        self.receipts = receipts
        self.tap = tap
        self.agent_kwargs = agent
        self.out = io.StringIO()
        self.agent: Agent | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_code: int | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runner-agent", daemon=True)

    def _run(self) -> None:
        async def main() -> int:
            self.loop = asyncio.get_running_loop()
            self.agent = Agent(
                self.config, self.receipts, SystemClock(), out=self.out, hub_wire=self.tap, **self.agent_kwargs
            )
            self._started.set()
            return await self.agent.run()

        self.exit_code = asyncio.run(main())

    def start(self) -> RunnerThread:
        self._thread.start()
        assert self._started.wait(10)
        return self

    @property
    def a(self) -> Agent:
        assert self.agent is not None
        return self.agent

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.a.request_stop)
        self._thread.join(40)
        assert not self._thread.is_alive(), "the runner did not stop"

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()


@dataclass
class Env:
    server: HubServer
    hermes: HermesFixture
    runner: RunnerThread
    tap: HubTap
    runner_id: str
    receipts: Receipts

    # --- accounts

    def account(self, username: str = "alice") -> AccountRef:
        found = self.server.hub.accounts.get(username)
        assert found is not None
        return AccountRef(found.username, found.tenant, found.auth_version)

    # --- the hub side

    def open(
        self, *, account: AccountRef | None = None, cleanup_only: bool = False, bound: str | None = None
    ) -> Gateway:
        return self.server.call(
            self.server.hub.channels.open_gateway(
                self.runner_id, account or self.account(), cleanup_only=cleanup_only, bound_stored_id=bound
            )
        )

    def open_later(self, **kwargs: Any) -> Any:
        """Start ``open_gateway`` on the hub loop; returns a concurrent future."""
        assert self.server._loop is not None
        coro = self.server.hub.channels.open_gateway(self.runner_id, kwargs.pop("account", None) or self.account())
        return asyncio.run_coroutine_threadsafe(coro, self.server._loop)

    def rpc(self, gateway: Gateway, method: str, params: dict[str, Any]) -> Any:
        return self.server.call(self.server.hub.channels.rpc(gateway, method, params))

    def rpc_later(self, gateway: Gateway, method: str, params: dict[str, Any]) -> Any:
        assert self.server._loop is not None
        return asyncio.run_coroutine_threadsafe(
            self.server.hub.channels.rpc(gateway, method, params), self.server._loop
        )

    def close(self, gateway: Gateway) -> None:
        self.server.call(self.server.hub.channels.close_gateway(gateway))

    def create(self, gateway: Gateway, profile: str | None = None) -> tuple[str, str]:
        params: dict[str, Any] = {"close_on_disconnect": False}
        if profile is not None:
            params["profile"] = profile
        result = self.rpc(gateway, "session.create", params)
        return result["session_id"], result["stored_session_id"]

    def frames(self, gateway: Gateway, until: Callable[[dict[str, Any] | None], bool], timeout: float = 10) -> list:
        """Frames of the hub-side gateway, in order, up to the first that satisfies ``until`` (None: closed)."""

        async def read() -> list[dict[str, Any] | None]:
            got: list[dict[str, Any] | None] = []
            async with asyncio.timeout(timeout):
                while True:
                    frame = await gateway.events.get()
                    got.append(frame)
                    if until(frame):
                        return got

        return self.server.call(read(), timeout + 5)

    def queued_frames(self, gateway: Gateway) -> list[dict[str, Any] | None]:
        async def read() -> list[dict[str, Any] | None]:
            got: list[dict[str, Any] | None] = []
            while not gateway.events.empty():
                got.append(gateway.events.get_nowait())
            return got

        return self.server.call(read())

    def hub_gateways(self) -> dict[str, Gateway]:
        state = self.server.hub.runners.state_of(self.runner_id)
        return dict(state.gateways) if state is not None else {}

    # --- the runner side

    def channels(self) -> dict[str, Any]:
        return dict(self.runner.a.gateways.channels)


def code_of(call: Callable[[], Any]) -> str:
    with pytest.raises(TalariaError) as info:
        call()
    return info.value.code


def complete(frame: dict[str, Any] | None, session_id: str) -> bool:
    return frame is None or (frame["type"] == "message.complete" and frame.get("session_id") == session_id)


@pytest.fixture
def hermes() -> Iterator[HermesFixture]:
    with HermesFixture(profiles=HERMES_PROFILES) as fixture:
        yield fixture


@contextmanager
def running_env(
    tmp_path: Path, hermes: HermesFixture, monkeypatch: pytest.MonkeyPatch, *, proxy: TcpProxy | None = None,
    **agent: Any,
) -> Iterator[Env]:  # fmt: skip
    """A hub, the runner registered on it (reaching it through ``proxy`` when given) and connected."""
    monkeypatch.setenv("HERMES_DASHBOARD_SESSION_TOKEN", hermes.session_token)
    server = HubServer(tmp_path / "data", SystemClock()).start()
    runner: RunnerThread | None = None
    receipts: Receipts | None = None
    try:
        for username in ("alice", "bob"):
            add_account(server, username, allowed_profiles={"local": HUB_PROFILES})
        if proxy is not None:
            proxy.backends = [("127.0.0.1", int(server.url.rsplit(":", 1)[1]))]
        fields = parse_registration(
            {"name": "node", "allowedProfiles": HUB_PROFILES, "hermesURL": hermes.url},
            default_server_url=proxy.url if proxy is not None else server.url,
        )
        registration = server.hub.registry.register("default", fields)
        config = parse_config(registration.config | {"allowedProfiles": RUNNER_PROFILES})
        tap = HubTap(hub_wire(config.server_url, config.runner_id))
        receipts = Receipts(tmp_path / "runner-commands.sqlite3", SystemClock())
        runner = RunnerThread(config, receipts, tap, **agent).start()
        wait_until(lambda: runner is not None and runner.a.connected, what="the runner to connect")
        wait_until(lambda: server.hub.runners.is_connected(registration.runner.id), what="the hub state")
        yield Env(server, hermes, runner, tap, registration.runner.id, receipts)
    finally:
        if runner is not None:
            runner.stop()
        if receipts is not None:
            receipts.close()
        server.stop()


@pytest.fixture
def env(tmp_path: Path, hermes: HermesFixture, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    with running_env(tmp_path, hermes, monkeypatch) as made:
        yield made


# --- opening, a turn, events ---------------------------------------------------------------------------------------


def test_a_turn_streams_its_events_through_the_hub(env: Env) -> None:
    gateway = env.open()
    assert set(env.channels()) == {gateway.id}
    runtime_id, stored_id = env.create(gateway)
    assert env.receipts.session_profile(stored_id) == "default"
    assert env.runner.a.gateways.profile_of(runtime_id) == "default"
    assert env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "hello"}) == {"status": "streaming"}
    frames = env.frames(gateway, lambda f: complete(f, runtime_id))
    kinds = [f["type"] for f in frames if f is not None]
    assert kinds[0] == "session.info" and "message.start" in kinds and kinds[-1] == "message.complete", kinds
    assert frames[-1] is not None and frames[-1]["payload"]["text"] == "echo: hello"
    assert all(set(f) <= {"type", "session_id", "payload"} for f in frames if f is not None)
    # the running mark was cleared by message.complete: another prompt is accepted
    assert env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "again"}) == {"status": "streaming"}
    env.frames(gateway, lambda f: complete(f, runtime_id))
    assert env.hermes.prompt_count("again") == 1
    env.close(gateway)
    wait_until(lambda: env.hermes.connection_count() == 0, what="the WebSocket to close")
    assert env.channels() == {}
    assert env.runner.a.gateways.profile_of(runtime_id) is None


def test_only_owned_sessions_events_are_forwarded(env: Env) -> None:
    first, second = env.open(), env.open(account=env.account("bob"))
    mine, _ = env.create(first)
    theirs, _ = env.create(second)
    env.frames(first, lambda f: f is not None and f["type"] == "session.info")
    env.frames(second, lambda f: f is not None and f["type"] == "session.info")
    env.hermes.approval_for("needs approval")
    env.rpc(second, "prompt.submit", {"session_id": theirs, "text": "needs approval"})
    env.frames(second, lambda f: f is not None and f["type"] == "approval.request")
    # Hermes sends a session's events to the socket it is attached to: attach the second channel's session to the
    # first channel's socket, so that the rest of its turn arrives on the first channel's WebSocket.
    first_socket = env.hermes.session(mine)
    assert first_socket is not None

    async def reattach() -> None:
        state = env.hermes._state
        with state.cond:
            state.live[theirs].sink = state.connections[first_socket.connection]

    env.hermes._on_loop(reattach)
    env.rpc(second, "approval.respond", {"session_id": theirs, "choice": "once"})
    env.hermes.wait_for(lambda: env.hermes.turns()[-1].status == "complete")
    env.rpc(first, "prompt.submit", {"session_id": mine, "text": "mine"})
    frames = env.frames(first, lambda f: complete(f, mine))
    assert frames and all(f is not None and f.get("session_id") in (None, mine) for f in frames), frames
    posted = [b for b in env.tap.bodies("event") if b["connectionId"] == first.id and "frame" in b]
    assert all(b["frame"].get("session_id") != theirs for b in posted)
    assert env.queued_frames(second) == []  # nothing of the turn reached its own channel either


def test_a_closed_channel_cannot_touch_another_channels_session(env: Env) -> None:
    first, second = env.open(), env.open()
    mine, _ = env.create(first)
    theirs, _ = env.create(second)
    env.hermes.approval_for("hold")
    env.rpc(first, "prompt.submit", {"session_id": mine, "text": "hold one"})
    env.rpc(second, "prompt.submit", {"session_id": theirs, "text": "hold two"})
    env.hermes.wait_for(lambda: all(s.running for s in env.hermes.live_sessions()))
    for method in ("session.interrupt", "session.close", "prompt.submit", "session.steer", "session.usage"):
        assert code_of(lambda m=method: env.rpc(first, m, {"session_id": theirs, "text": "x"})) == (
            "runner_session_forbidden"
        ), method
    env.close(first)  # interrupts its own running session only
    env.hermes.wait_for(lambda: (s := env.hermes.session(mine)) is None or not s.running)
    interrupted = [r.params["session_id"] for r in env.hermes.rpc_requests("session.interrupt")]
    assert interrupted == [mine]
    theirs_now = env.hermes.session(theirs)
    assert theirs_now is not None and theirs_now.running
    assert code_of(lambda: env.rpc(first, "session.interrupt", {"session_id": mine})) == "runner_connection_closed"
    # on the runner the closed id is gone and tombstoned; the other channel still works
    assert set(env.channels()) == {second.id}
    assert env.rpc(second, "session.interrupt", {"session_id": theirs}) == {"status": "interrupted"}


# --- admission ----------------------------------------------------------------------------------------------------


def test_a_queued_command_is_not_run_after_the_accounts_access_changed(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    # no event may be in flight when the account changes (the hub would close the connection on it: 410)
    env.frames(gateway, lambda f: f is not None and f["type"] == "session.info")
    env.tap.hold_admit.set()
    pending = env.rpc_later(gateway, "prompt.submit", {"session_id": runtime_id, "text": "never runs"})
    assert env.tap.admit_held.wait(10)
    env.server.hub.accounts.update("alice", "default", {"allowedProfiles": {"local": ["default", "work"]}})
    env.tap.release_admit.set()
    with pytest.raises(TalariaError) as info:
        pending.result(30)
    assert info.value.code == "runner_command_not_admitted"
    assert env.hermes.prompt_count("never runs") == 0
    assert env.hermes.rpc_requests("prompt.submit") == []


# --- open and close -----------------------------------------------------------------------------------------------


def test_a_gateway_closed_during_a_slow_handshake_is_not_revived(env: Env) -> None:
    env.hermes.knobs.ready_delay = 1.5
    future = env.open_later()
    wait_until(lambda: env.hermes.connections_opened() == 1, what="the WebSocket upgrade")
    wait_until(lambda: len(env.hub_gateways()) == 1, what="the hub-side gateway")
    (gateway,) = env.hub_gateways().values()
    env.close(gateway)
    with pytest.raises(TalariaError) as info:
        future.result(10)
    assert info.value.code == "runner_connection_closed"
    wait_until(
        lambda: env.tap.result_of(lambda b: b.get("error", {}).get("code") == "runner_connection_closed"),
        what="the runner's own reply to the open",
    )
    wait_until(lambda: env.hermes.connection_count() == 0, what="the late WebSocket to close")
    time.sleep(0.3)
    assert env.channels() == {}
    assert env.hub_gateways() == {}
    assert env.hermes.connections_opened() == 1
    # the closed id stays refused on the runner (tombstone)
    assert gateway.id in env.runner.a.gateways.tombstones


def test_a_local_disconnect_during_a_handshake_closes_the_late_socket(env: Env) -> None:
    env.hermes.knobs.ready_delay = 1.5
    future = env.open_later()
    wait_until(lambda: env.hermes.connections_opened() == 1, what="the WebSocket upgrade")
    old_epoch = env.runner.a.server_epoch

    async def disconnect() -> None:
        await env.server.hub.runners.disconnect(env.runner_id, "test")

    env.server.call(disconnect())
    with pytest.raises(TalariaError) as info:
        future.result(10)
    assert info.value.code == "runner_command_uncertain"  # delivered, then the hub state ended
    wait_until(lambda: env.runner.a.connected and env.runner.a.server_epoch != old_epoch, what="a new epoch")
    wait_until(lambda: env.hermes.connection_count() == 0, what="the late WebSocket to close")
    time.sleep(0.3)
    assert env.channels() == {} and env.hermes.connections_opened() == 1
    assert env.tap.bodies("event") == []


def test_hermes_unavailable_when_ready_never_comes(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gateway_module.READY_TIMEOUT_S == 20
    monkeypatch.setattr(gateway_module, "READY_TIMEOUT_S", 1.0)  # the wait, shortened for the test
    env.hermes.knobs.send_ready = False
    started = time.monotonic()
    assert code_of(env.open) == "hermes_unavailable"
    assert 1 <= time.monotonic() - started < 5
    assert env.channels() == {}
    wait_until(lambda: env.hermes.connection_count() == 0, what="the WebSocket to close")


def test_sixty_four_channels_and_not_one_more(env: Env) -> None:
    gateways = [env.open() for _ in range(64)]
    assert len(env.channels()) == 64
    assert env.hermes.connection_count() == 64
    assert code_of(env.open) == "runner_busy"
    assert env.hermes.connections_opened() == 64
    env.close(gateways[0])
    again = env.open()
    assert len(env.channels()) == 64
    for gateway in [*gateways[1:], again]:
        env.close(gateway)
    wait_until(lambda: env.hermes.connection_count() == 0, what="every WebSocket to close")


def test_open_and_close_payload_rules(env: Env) -> None:
    account = env.account()

    async def send(kind: str, payload: dict[str, Any], connection_id: str | None = None) -> Any:
        hub = env.server.hub
        if connection_id is not None:
            state = hub.runners.state_of(env.runner_id)
            state.gateways[connection_id] = Gateway(connection_id, env.runner_id, account, False)
        return await hub.runners.send(
            env.runner_id, kind, payload, account=account, profile=None, connection_id=connection_id
        )

    def sent(kind: str, payload: dict[str, Any], connection_id: str | None = None) -> Any:
        return env.server.call(send(kind, payload, connection_id))

    assert sent("gateway.close", {"connectionId": str(uuid.uuid4())}) == {"ok": True}
    assert sent("gateway.close", {"connectionId": "not a uuid"}) == {"ok": True}
    assert code_of(lambda: sent("gateway.close", {"connectionId": 5})) == "runner_command_forbidden"
    bad = str(uuid.uuid4()).upper()
    assert code_of(lambda: sent("gateway.open", {"connectionId": bad}, bad)) == "runner_command_forbidden"
    fresh = str(uuid.uuid4())
    assert code_of(lambda: sent("gateway.open", {"connectionId": fresh, "cleanupOnly": "yes"}, fresh)) == (
        "runner_command_forbidden"
    )
    extra = str(uuid.uuid4())
    assert code_of(lambda: sent("gateway.open", {"connectionId": extra, "x": 1}, extra)) == "runner_command_forbidden"
    # a closed id is tombstoned: opening it again is refused
    gateway = env.open()
    env.close(gateway)
    assert code_of(lambda: sent("gateway.open", {"connectionId": gateway.id}, gateway.id)) == (
        "runner_command_forbidden"
    )
    # a close that overtook its open: the id is refused
    early = str(uuid.uuid4())
    assert sent("gateway.close", {"connectionId": early}) == {"ok": True}
    assert code_of(lambda: sent("gateway.open", {"connectionId": early}, early)) == "runner_command_forbidden"
    # an id in use
    live = env.open()
    assert code_of(lambda: sent("gateway.open", {"connectionId": live.id}, live.id)) == "runner_command_forbidden"
    assert code_of(lambda: sent("gateway.rpc", {"connectionId": live.id, "method": "session.create"}, live.id)) == (
        "runner_command_forbidden"
    )
    assert env.hermes.connections_opened() == 2


# --- allow-list and per-method rules ------------------------------------------------------------------------------


def test_the_allow_list(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    for method in ("session.cwd.set", "session.history", "profiles.list", "shell.exec"):
        assert code_of(lambda m=method: env.rpc(gateway, m, {"session_id": runtime_id, "cwd": "/"})) == (
            "runner_command_forbidden"
        ), method
    assert [r.method for r in env.hermes.rpc_requests()] == ["session.create"]
    assert env.rpc(gateway, "session.usage", {"session_id": runtime_id})["calls"] == 0


def test_profile_rules(env: Env) -> None:
    gateway = env.open()
    assert code_of(lambda: env.create(gateway, "local-off")) == "runner_profile_forbidden"
    assert code_of(lambda: env.create(gateway, "ghost")) == "runner_profile_forbidden"  # Hermes does not list it
    assert env.hermes.rpc_requests("session.create") == []
    runtime_id, stored_id = env.create(gateway, "work")
    assert env.runner.a.gateways.profile_of(runtime_id) == "work"
    assert env.receipts.session_profile(stored_id) == "work"
    view = env.hermes.session(runtime_id)
    assert view is not None and view.profile == "work"
    default_id, _ = env.create(gateway)
    assert env.runner.a.gateways.profile_of(default_id) == "default"
    # the Hermes profile listing is asked for named profiles only
    lists = [r for r in env.hermes.requests("/api/profiles") if r.status == 200]
    assert lists
    # session.resume follows the same rules
    assert code_of(lambda: env.rpc(gateway, "session.resume", {"session_id": stored_id, "profile": "ghost"})) == (
        "runner_profile_forbidden"
    )
    # a JSON-RPC error is gateway_rejected with Hermes' message
    with pytest.raises(TalariaError) as info:
        env.rpc(gateway, "session.resume", {"session_id": "20990101_000000_nothere", "profile": "work"})
    assert info.value.code == "gateway_rejected" and "session not found" in str(info.value)


def test_prompt_submit_on_a_running_session_is_busy(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.hermes.approval_for("slow")
    env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "slow work"})
    env.frames(gateway, lambda f: f is not None and f["type"] == "approval.request")
    assert code_of(lambda: env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "more"})) == (
        "runner_session_busy"
    )
    assert env.rpc(gateway, "session.steer", {"session_id": runtime_id, "text": "and this"})["status"] == "queued"
    env.rpc(gateway, "approval.respond", {"session_id": runtime_id, "choice": "once"})
    env.frames(gateway, lambda f: complete(f, runtime_id))
    assert env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "next"}) == {"status": "streaming"}
    assert env.hermes.prompt_count("more") == 0


def test_clarify_respond_needs_a_pending_request_of_an_owned_session(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.hermes.clarify_for("ask me", "which one?", ["a", "b"])
    env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "ask me"})
    frames = env.frames(gateway, lambda f: f is not None and f["type"] == "clarify.request")
    request_id = frames[-1]["payload"]["request_id"]
    wrong = {"session_id": runtime_id, "request_id": "deadbeef", "answer": "a"}
    assert code_of(lambda: env.rpc(gateway, "clarify.respond", wrong)) == "runner_session_forbidden"
    other, _ = env.create(gateway)
    misplaced = {"session_id": other, "request_id": request_id, "answer": "a"}
    assert code_of(lambda: env.rpc(gateway, "clarify.respond", misplaced)) == "runner_session_forbidden"
    answer = {"session_id": runtime_id, "request_id": request_id, "answer": "b"}
    assert env.rpc(gateway, "clarify.respond", answer) == {"status": "ok"}
    sent = env.hermes.rpc_requests("clarify.respond")
    assert [r.params for r in sent] == [{"request_id": request_id, "answer": "b"}]  # session_id stripped
    env.frames(gateway, lambda f: complete(f, runtime_id))
    assert code_of(lambda: env.rpc(gateway, "clarify.respond", answer)) == "runner_session_forbidden"  # used


def test_active_list_is_exact_and_filtered(env: Env) -> None:
    gateway, other = env.open(), env.open()
    runtime_id, _ = env.create(gateway, "work")
    env.frames(gateway, lambda f: f is not None and f["type"] == "session.info")  # the agent is built: idle
    env.create(gateway)
    foreign, _ = env.create(other)
    good = {"profile": "work", "current_session_id": runtime_id}
    reply = env.rpc(gateway, "session.active_list", good)
    assert reply == {"sessions": [{"id": runtime_id, "status": "idle"}]}
    for params in (
        {"profile": "default", "current_session_id": runtime_id},  # not its profile
        {"profile": "default", "current_session_id": foreign},  # not owned here
        {"current_session_id": runtime_id},  # not exactly {profile, current_session_id}
        {"profile": "work", "current_session_id": runtime_id, "extra": 1},
    ):
        assert code_of(lambda p=params: env.rpc(gateway, "session.active_list", p)) == "runner_session_forbidden"


def test_cleanup_only_channels(env: Env) -> None:
    gateway = env.open()
    runtime_id, stored_id = env.create(gateway)
    env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "persist me"})
    env.frames(gateway, lambda f: complete(f, runtime_id))
    env.close(gateway)
    cleanup = env.open(cleanup_only=True, bound=stored_id)
    for method, params in (
        ("session.create", {}),
        ("prompt.submit", {"session_id": runtime_id, "text": "no"}),
        ("session.usage", {"session_id": runtime_id}),
        ("session.steer", {"session_id": runtime_id, "text": "no"}),
    ):
        assert code_of(lambda m=method, p=params: env.rpc(cleanup, m, p)) == "runner_command_forbidden", method
    resumed = env.rpc(cleanup, "session.resume", {"session_id": stored_id})
    assert resumed["session_id"] == runtime_id  # still live in Hermes: the same runtime id
    assert env.rpc(cleanup, "session.interrupt", {"session_id": runtime_id}) == {"status": "interrupted"}
    listed = env.rpc(cleanup, "session.active_list", {"profile": "default", "current_session_id": runtime_id})
    assert [s["id"] for s in listed["sessions"]] == [runtime_id]
    assert env.rpc(cleanup, "session.close", {"session_id": runtime_id}) == {"closed": True}
    assert env.hermes.rpc_requests("prompt.submit")[-1].params["text"] == "persist me"


def test_a_session_created_on_a_connection_closed_meanwhile_is_uncertain(env: Env) -> None:
    gateway = env.open()
    env.hermes.delay_method("session.create", 1.0)
    pending = env.rpc_later(gateway, "session.create", {"close_on_disconnect": False})
    env.hermes.wait_for(lambda: len(env.hermes.rpc_requests("session.create")) == 1)
    env.close(gateway)
    with pytest.raises(TalariaError) as info:
        pending.result(10)
    assert info.value.code == "runner_connection_closed"  # the hub's side of the close
    wait_until(
        lambda: env.tap.result_of(lambda b: b.get("error", {}).get("code") == "runner_command_uncertain"),
        what="the runner's uncertain reply",
    )
    assert env.runner.a.gateways.ownership.owners == {}


# --- events, Hermes closing, the hub refusing ---------------------------------------------------------------------


def test_hermes_closing_the_socket_closes_the_hub_side(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.frames(gateway, lambda f: f is not None and f["type"] == "session.info")
    env.hermes.restart()
    assert env.frames(gateway, lambda f: f is None)[-1] is None
    assert not gateway.open
    closed = [b for b in env.tap.bodies("event") if b == {"connectionId": gateway.id, "closed": True}]
    assert len(closed) == 1
    wait_until(lambda: env.channels() == {}, what="the runner to forget the channel")
    assert env.runner.a.gateways.profile_of(runtime_id) is None
    assert env.runner.a.connected  # only that connection ended


def test_a_410_closes_only_that_connection(env: Env) -> None:
    env.hermes.knobs.delta_count = 40
    env.hermes.knobs.delta_delay = 0.05
    alice, bob = env.open(), env.open(account=env.account("bob"))
    alice_session, _ = env.create(alice)
    bob_session, _ = env.create(bob)
    env.rpc(alice, "prompt.submit", {"session_id": alice_session, "text": "a long answer " * 5})
    env.rpc(bob, "prompt.submit", {"session_id": bob_session, "text": "another long answer " * 5})
    env.frames(alice, lambda f: f is not None and f["type"] == "message.delta")
    env.server.hub.accounts.update("alice", "default", {"allowedProfiles": {"local": ["default"]}})
    # the next event of alice's connection gets 410: that channel interrupts its session and closes
    env.hermes.wait_for(lambda: [r.params for r in env.hermes.rpc_requests("session.interrupt")], timeout=10)
    wait_until(lambda: set(env.channels()) == {bob.id}, what="alice's channel to close")
    assert [r.params["session_id"] for r in env.hermes.rpc_requests("session.interrupt")] == [alice_session]
    assert env.runner.a.connected
    frames = env.frames(bob, lambda f: complete(f, bob_session))
    assert frames[-1] is not None and frames[-1]["payload"]["status"] == "complete"


def test_an_oversized_event_closes_its_connection(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.frames(gateway, lambda f: f is not None and f["type"] == "session.info")
    env.hermes.knobs.delta_count = 40  # deltas of 435 KiB are forwarded; message.complete holds all 17 MiB
    env.hermes.reply_for("huge", "x" * (17 * 1024 * 1024))
    env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "huge"})
    frames = env.frames(gateway, lambda f: f is None, timeout=30)
    kinds = [f["type"] for f in frames if f is not None]
    assert "message.delta" in kinds and "message.complete" not in kinds, kinds
    assert sum(1 for f in frames if f is not None and f["type"] == "message.delta") == 40
    assert env.runner.a.connected
    assert [b for b in env.tap.bodies("event") if "closed" in b] == [{"connectionId": gateway.id, "closed": True}]
    wait_until(lambda: env.channels() == {}, what="the channel to close")
    wait_until(lambda: env.hermes.connection_count() == 0, what="the WebSocket to close")


def test_an_event_of_a_few_mib_is_forwarded(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.hermes.knobs.delta_count = 1
    env.hermes.reply_for("big", "y" * (3 * 1024 * 1024))
    env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "big"})
    frames = env.frames(gateway, lambda f: complete(f, runtime_id), timeout=30)
    assert frames[-1] is not None and len(frames[-1]["payload"]["text"]) == 3 * 1024 * 1024


# --- local disconnect ---------------------------------------------------------------------------------------------


def test_an_epoch_reset_closes_obsolete_gateways_exactly_once(env: Env) -> None:
    first, second = env.open(), env.open()
    running, _ = env.create(first)
    idle, _ = env.create(second)
    env.frames(second, lambda f: f is not None and f["type"] == "session.info")
    env.hermes.approval_for("wait")
    env.rpc(first, "prompt.submit", {"session_id": running, "text": "wait for me"})
    env.frames(first, lambda f: f is not None and f["type"] == "approval.request")
    old_epoch = env.runner.a.server_epoch
    events_before = len(env.tap.bodies("event"))

    async def disconnect() -> None:
        await env.server.hub.runners.disconnect(env.runner_id, "test")

    env.server.call(disconnect())
    wait_until(lambda: env.runner.a.connected and env.runner.a.server_epoch != old_epoch, what="a new epoch")
    wait_until(lambda: env.hermes.connection_count() == 0, what="the obsolete WebSockets to close")
    assert env.channels() == {}
    assert [r.params["session_id"] for r in env.hermes.rpc_requests("session.interrupt")] == [running]
    assert env.hermes.connections_opened() == 2
    assert len(env.tap.bodies("event")) == events_before  # no event posted after the local disconnect
    assert sum("runner disconnected" in line for line in env.runner.lines()) == 1
    assert env.runner.a.gateways.profile_of(running) is None and env.runner.a.gateways.profile_of(idle) is None
    time.sleep(0.5)
    assert env.hermes.connections_opened() == 2 and len(env.hermes.rpc_requests("session.interrupt")) == 1
    # the runner works under the new epoch
    fresh = env.open()
    assert env.create(fresh)[0]


# --- the JSON-RPC channel itself (talaria.hermes.ws) --------------------------------------------------------------


def test_the_channel_matches_responses_and_delivers_events_in_order(hermes: HermesFixture) -> None:
    events: list[dict[str, Any]] = []
    lost: list[bool] = []

    async def scenario() -> None:
        channel = await HermesChannel.connect(
            hermes.url, ("token", hermes.session_token), on_event=events.append, on_lost=lambda: lost.append(True)
        )
        created = await channel.request("session.create", {"close_on_disconnect": False})
        runtime_id = created["session_id"]
        hermes.delay_method("session.usage", 0.3, times=1)
        slow = asyncio.ensure_future(channel.request("session.usage", {"session_id": runtime_id}))
        fast = await channel.request("session.interrupt", {"session_id": runtime_id})
        assert fast == {"status": "interrupted"} and not slow.done()  # answered out of order, matched by id
        assert (await slow)["calls"] == 0
        with pytest.raises(RpcError) as info:
            await channel.request("session.usage", {"session_id": "nothere"})
        assert info.value.code == 4001 and info.value.message == "session not found"
        hermes.delay_method("session.usage", None, times=1)
        with pytest.raises(RpcTimeout):
            await channel.request("session.usage", {"session_id": runtime_id}, timeout=0.2)
        await channel.request("prompt.submit", {"session_id": runtime_id, "text": "hi"})
        while not any(e["type"] == "message.complete" for e in events):
            await asyncio.sleep(0.01)
        hermes.delay_method("session.usage", None, times=1)
        pending = asyncio.ensure_future(channel.request("session.usage", {"session_id": runtime_id}))
        await asyncio.sleep(0.1)
        hermes.drop_connections()
        with pytest.raises(ChannelClosed) as closed:
            await pending
        assert closed.value.sent
        with pytest.raises(ChannelClosed) as refused:
            await channel.request("session.usage", {"session_id": runtime_id})
        assert not refused.value.sent
        await channel.close()

    asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.info" and "gateway.ready" not in kinds
    assert kinds.index("message.start") < kinds.index("message.delta") < kinds.index("message.complete")
    assert lost == [True]
    ids = [r.id for r in hermes.rpc_requests()]
    assert len(ids) == len(set(ids)) and all(uuid.UUID(str(i)) for i in ids)


def test_a_local_close_is_not_reported_as_lost(hermes: HermesFixture) -> None:
    lost: list[bool] = []

    async def scenario() -> None:
        channel = await HermesChannel.connect(
            hermes.url, ("token", hermes.session_token), on_event=lambda e: None, on_lost=lambda: lost.append(True)
        )
        await channel.close()
        assert channel.closed

    asyncio.run(scenario())
    hermes.wait_for(lambda: hermes.connection_count() == 0)
    assert lost == []


def test_credentials_stay_out_of_errors_and_logs(hermes: HermesFixture, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "wrong-" + hermes.session_token

    async def scenario() -> None:
        with pytest.raises(AuthRefused) as refused:
            await HermesChannel.connect(hermes.url, ("token", secret), on_event=lambda e: None, on_lost=lambda: None)
        assert secret not in str(refused.value) and refused.value.__cause__ is None
        hermes.knobs.send_ready = False
        with pytest.raises(HermesUnavailable) as late:
            await HermesChannel.connect(
                hermes.url, ("token", hermes.session_token), on_event=lambda e: None, on_lost=lambda: None,
                ready_timeout=0.3,
            )  # fmt: skip
        assert hermes.session_token not in str(late.value)
        hermes.knobs.send_ready = True
        channel = await HermesChannel.connect(
            hermes.url, ("token", hermes.session_token), on_event=lambda e: None, on_lost=lambda: None
        )
        await channel.request("session.create", {})
        await channel.close()

    asyncio.run(scenario())
    # the client side only: the fixture's own server (uvicorn, talaria.testing) logs what it received
    ours = [r for r in caplog.records if not r.name.startswith(("talaria.testing", "uvicorn"))]
    for record in ours:
        text = record.getMessage() + repr(record.args) + repr(getattr(record, "__dict__", {}))
        assert hermes.session_token not in text and secret not in text, record.name


# --- a tool grant through the whole runner ---------------------------------------------------------------------------


def test_a_team_tool_call_travels_from_the_loopback_listener_to_the_hub_and_back(env: Env) -> None:
    gateway = env.open()
    runtime_id, stored_id = env.create(gateway)
    account = env.account()
    calls: list[tuple[str, dict[str, Any]]] = []

    async def executor(tool_id: str, arguments: dict[str, Any]) -> Any:
        calls.append((tool_id, arguments))
        return {"account": account.username, "echo": arguments}

    catalog = [{"id": "whoami", "name": "whoami", "description": "who am I", "inputSchema": {"type": "object"}}]
    session = {"runtimeId": runtime_id, "storedId": stored_id}
    grant = env.server.call(
        env.server.hub.channels.create_grant(
            env.runner_id, account, profile="default", work_id="work-1", session=session, catalog=catalog,
            executor=executor, turn_active=lambda: True,
        )
    )  # fmt: skip
    expires = env.server.call(env.server.hub.channels.bind_grant(grant, session))
    assert expires > 0
    bound = env.hermes.binds()[-1]
    bridge, bearer = bound["bridge_url"], bound["token"]
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    with httpx.Client(base_url=bridge, timeout=10) as listener:
        tools = listener.post("/tools/list", content=b"{}", headers=headers).json()["tools"]
        assert [t["name"] for t in tools] == ["whoami"] and tools[0]["id"].startswith("team_")
        body = {"toolId": tools[0]["id"], "arguments": {"claimed_account": "mallory"}, "callId": "c-1"}
        first = listener.post("/tools/call", json=body, headers=headers).json()
        again = listener.post("/tools/call", json=body, headers=headers).json()
        # the hub ran the tool once, with the account it bound, whatever the arguments claim
        assert first == again and first["structuredContent"]["account"] == "alice"
        assert calls == [("whoami", {"claimed_account": "mallory"})]
        env.close(gateway)  # closing the owning channel disposes the grant and its listener
        wait_until(lambda: not env.runner.a.grants.open_ids(), what="the grant to be disposed")
        with pytest.raises(httpx.TransportError):
            listener.post("/tools/list", content=b"{}", headers=headers)


# --- failover-v1 (scale.md 3.5) -----------------------------------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    made = TcpProxy([]).start()
    try:
        yield made
    finally:
        made.stop()


def lines_with(env: Env, text: str) -> list[str]:
    return [line for line in env.runner.lines() if text in line]


def test_a_session_runs_on_through_a_hub_outage_within_the_failover_window(
    tmp_path: Path, hermes: HermesFixture, monkeypatch: pytest.MonkeyPatch, proxy: TcpProxy
) -> None:
    with running_env(tmp_path, hermes, monkeypatch, proxy=proxy) as env:
        assert env.runner.a.hub.failover, "the hub echoes failover-v1"
        gateway = env.open()
        runtime_id, _ = env.create(gateway)
        channel, disconnects, epoch = env.channels()[gateway.id], env.runner.a.disconnects, env.runner.a.server_epoch
        with proxy.outage():  # the held poll is reset; new connections are refused
            wait_until(lambda: env.runner.a.polls_ridden_out >= 2, what="two poll failures ridden out")
            assert env.runner.a.connected and env.channels() == {gateway.id: channel}
        assert env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "after"}) == {"status": "streaming"}
        frames = env.frames(gateway, lambda f: complete(f, runtime_id))
        assert frames[-1] is not None and frames[-1]["payload"]["text"] == "echo: after"
        assert (env.runner.a.disconnects, env.runner.a.server_epoch) == (disconnects, epoch)
        assert lines_with(env, "runner connected") == ["runner connected"]
        assert lines_with(env, "runner disconnected") == []
        seqs = env.tap.seqs(gateway.id)
        assert seqs == sorted(seqs) and sorted(set(seqs)) == list(range(1, max(seqs) + 1)), seqs  # retries repeat


def test_an_outage_longer_than_the_window_is_a_local_disconnect_and_a_new_epoch(
    tmp_path: Path, hermes: HermesFixture, monkeypatch: pytest.MonkeyPatch, proxy: TcpProxy
) -> None:
    with running_env(tmp_path, hermes, monkeypatch, proxy=proxy, failover_window_s=0.5) as env:
        gateway = env.open()
        env.create(gateway)
        epoch = env.runner.a.server_epoch
        with proxy.outage():
            wait_until(lambda: lines_with(env, "runner disconnected"), what="the local disconnect")
            # The status line is said before the channels close (agent.local_disconnect), so wait for the close too.
            wait_until(lambda: env.channels() == {}, what="the disconnect closing the channel on the runner")
        wait_until(lambda: len(lines_with(env, "runner connected")) == 2, what="a new connection")
        assert env.runner.a.server_epoch != epoch, "the reconnect was a reset poll: a new state"
        assert lines_with(env, "runner disconnected")[0].startswith("runner disconnected: transport")


def test_without_the_hubs_echo_a_failed_poll_is_a_local_disconnect_at_once(
    tmp_path: Path, hermes: HermesFixture, monkeypatch: pytest.MonkeyPatch, proxy: TcpProxy
) -> None:
    with running_env(tmp_path, hermes, monkeypatch, proxy=proxy) as env:
        env.tap.echo = False
        gateway = env.open()  # this command's poll answer carried no echo
        assert not env.runner.a.hub.failover
        assert env.channels()[gateway.id].numbered is False
        with proxy.outage():
            wait_until(lambda: lines_with(env, "runner disconnected"), what="the local disconnect")
        assert env.runner.a.polls_ridden_out == 0


def test_an_event_whose_answer_was_lost_is_posted_again_and_stored_once(env: Env) -> None:
    gateway = env.open()
    runtime_id, _ = env.create(gateway)
    env.queued_frames(gateway)
    env.tap.lose_event_answers = 3
    assert env.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": "hello"}) == {"status": "streaming"}
    frames = [f for f in env.frames(gateway, lambda f: complete(f, runtime_id)) if f is not None]
    assert [f["type"] for f in frames].count("message.complete") == 1
    assert frames[-1]["payload"]["text"] == "echo: hello"
    assert len(frames) == len({json.dumps(f, sort_keys=True) for f in frames}), "no frame stored twice"
    seqs = [n for n in env.tap.seqs(gateway.id) if n is not None]
    assert sorted(set(seqs)) == list(range(1, max(seqs) + 1)), "gapless"
    assert len(seqs) - len(set(seqs)) == 3, "each lost answer made one retry of the same seq"
    assert env.runner.a.hub.retries == 3
    assert lines_with(env, "runner disconnected") == []
