"""failover-v1 on the runner's side of the wire (scale.md 3.5): the hub's echo decides, posts of the idempotent ops
failing by transport are sent again with the same body within the window, and nothing else is retried.

A ``HubClient`` over a scripted wire (the hub faked at its transport, convention 9) with an injected monotonic
clock that the wire advances, and no pauses between attempts.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from talaria.clock import ManualClock
from talaria.runner.agent import Agent
from talaria.runner.config import parse_config
from talaria.runner.hub_client import POLL_READ_TIMEOUT_S, HubClient, HubError, Identity, retry_delays
from talaria.runner.receipts import Receipts
from talaria.wire import WireError, WireReply

POLL_OK = json.dumps({"epoch": "e1", "commands": []}).encode()


class ScriptedWire:
    """Answers polls with ``echo`` in X-Hub-Features; fails the first ``failures`` posts as ``failure`` says."""

    def __init__(self, *, echo: str = "failover-v1", failures: int = 0, failure: str = "transport") -> None:
        self.echo = echo
        self.failures = failures
        self.failure = failure
        self.now = 0.0
        self.step = 1.0  # seconds each request takes on the injected clock
        self.posts: list[tuple[str, bytes | None]] = []
        self.timeouts: list[float | None] = []

    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:  # fmt: skip
        self.now += self.step
        op = target.rsplit("/", 1)[-1]
        if op == "poll":
            self.timeouts.append(timeout)
            return WireReply(200, {"x-hub-features": self.echo} if self.echo is not None else {}, POLL_OK)
        self.posts.append((op, body))
        if self.failures > 0:
            self.failures -= 1
            if self.failure == "transport":
                raise WireError("closed", "reset by peer")
            return WireReply(503, {}, b'{"code": "hub_shutting_down", "error": "retry"}')
        return WireReply(200, {}, b'{"ok": true}')

    async def aclose(self) -> None:
        return None


def no_pause() -> Callable[[], float]:
    return lambda: 0.0


def client(wire: ScriptedWire, window: float = 20.0) -> HubClient:
    identity = Identity(str(uuid.uuid4()), "t" * 32, str(uuid.uuid4()))
    return HubClient("http://127.0.0.1:1", identity, wire=wire, retry_window_s=window, monotonic=lambda: wire.now,
                     delays=no_pause)  # fmt: skip


def polled(wire: ScriptedWire, window: float = 20.0) -> HubClient:
    made = client(wire, window)
    asyncio.run(made.poll(reset=True, features=["failover-v1"]))
    return made


@pytest.mark.parametrize("op", ["admit", "result", "event", "tool"])
def test_a_post_failing_by_transport_is_sent_again_with_the_same_body(op: str) -> None:
    wire = ScriptedWire(failures=3)
    hub = polled(wire)
    body = {"id": "c1", "result": {"n": 1}}
    assert asyncio.run(hub.post(op, "e1", body)) == {"ok": True}
    assert [p[0] for p in wire.posts] == [op] * 4
    assert len({p[1] for p in wire.posts}) == 1, "the same bytes each time"
    assert hub.retries == 3


def test_retries_stop_when_the_window_after_the_first_send_has_passed() -> None:
    wire = ScriptedWire(failures=100)
    hub = polled(wire, window=5.0)  # each request takes 1 s on the injected clock
    with pytest.raises(HubError) as info:
        asyncio.run(hub.post("result", "e1", {"id": "c1", "result": None}))
    assert info.value.status == 0 and info.value.code == "transport"
    # the first send starts the 5 s window at t=1; sends end at t=2..6; the one ending at the window's end is the last
    assert len(wire.posts) == 5


def test_goodbye_is_not_retried() -> None:
    wire = ScriptedWire(failures=1)
    hub = polled(wire)
    with pytest.raises(HubError):
        asyncio.run(hub.post("goodbye", "e1", {}))
    assert len(wire.posts) == 1


def test_an_answer_from_the_hub_is_not_retried_only_a_transport_failure_is() -> None:
    wire = ScriptedWire(failures=1, failure="503")
    hub = polled(wire)
    with pytest.raises(HubError) as info:
        asyncio.run(hub.post("result", "e1", {"id": "c1", "result": None}))
    assert (info.value.status, info.value.code) == (503, "hub_shutting_down")
    assert len(wire.posts) == 1


@pytest.mark.parametrize("echo", [None, "", "team-tools-v1", "failover-v2"])
def test_without_failover_v1_in_the_last_echo_nothing_is_retried_and_polls_keep_the_default_timeout(
    echo: str | None,
) -> None:
    wire = ScriptedWire(echo=echo, failures=1)
    hub = polled(wire)
    assert not hub.failover
    with pytest.raises(HubError):
        asyncio.run(hub.post("event", "e1", {"connectionId": "c", "closed": True}))
    assert len(wire.posts) == 1
    asyncio.run(hub.poll(reset=False, features=["failover-v1"]))
    assert wire.timeouts == [None, None]


def test_with_failover_v1_a_poll_s_read_timeout_is_17_s_from_the_next_poll_on() -> None:
    wire = ScriptedWire(echo="team-tools-v1, failover-v1")
    hub = polled(wire)
    assert hub.hub_features == frozenset({"team-tools-v1", "failover-v1"})
    asyncio.run(hub.poll(reset=False, features=["failover-v1"]))
    assert wire.timeouts == [None, POLL_READ_TIMEOUT_S] and POLL_READ_TIMEOUT_S == 17.0
    wire.echo = None  # an older hub answered: the feature is no longer used
    asyncio.run(hub.poll(reset=False, features=["failover-v1"]))
    assert not hub.failover


def test_retry_pauses_are_full_jitter_under_a_ceiling_doubling_from_a_quarter_second_to_two() -> None:
    pause = retry_delays()
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    for ceiling in ceilings:
        assert 0.0 <= pause() <= ceiling
    samples = [retry_delays()() for _ in range(200)]
    assert max(samples) <= 0.25 and min(samples) < 0.05 and max(samples) > 0.2, "spread over the whole range"


# ---------------------------------------------------------------- the agent rides out poll failures


class PollScript:
    """Poll answers in order (an epoch, an HTTP status with a code, or ``"reset"`` for a transport failure); each
    poll advances the injected clock by ``step`` s before it is sent; after the script, polls wait until cancelled."""

    def __init__(self, script: list[str | tuple[int, str]], step: float = 1.0) -> None:
        self.script = list(script)
        self.step = step
        self.now = 0.0
        self.resets: list[bool] = []

    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:  # fmt: skip
        if not target.endswith("/poll"):
            return WireReply(200, {}, b'{"ok": true}')
        self.now += self.step
        self.resets.append((headers or {}).get("X-Runner-Reset") == "1")
        if not self.script:
            await asyncio.Event().wait()
        step = self.script.pop(0)
        if step == "reset":
            raise WireError("closed", "reset by peer")
        if isinstance(step, tuple):
            status, code = step
            return WireReply(status, {}, json.dumps({"code": code, "error": "x"}).encode())
        answer = json.dumps({"epoch": step, "commands": []}).encode()
        return WireReply(200, {"x-hub-features": "failover-v1,team-tools-v1"}, answer)

    async def aclose(self) -> None:
        return None


def run_agent(tmp_path: Path, wire: PollScript, window: float = 20.0) -> tuple[list[str], Agent]:
    config = parse_config({"protocol": 1, "serverURL": "http://127.0.0.1:9", "runnerId": str(uuid.uuid4()),
                           "token": "t" * 43, "allowedProfiles": ["default"]})  # fmt: skip
    out = io.StringIO()

    async def go() -> Agent:
        with Receipts(tmp_path / "receipts.sqlite3", ManualClock()) as receipts:
            agent = Agent(config, receipts, ManualClock(), out=out, hub_wire=wire, failover_window_s=window,
                          monotonic=lambda: wire.now)  # fmt: skip
            run = asyncio.get_running_loop().create_task(agent.run())
            while wire.script or not agent.connected:  # the script played out and the agent is connected again
                await asyncio.sleep(0.01)
            agent.request_stop()
            await run
            return agent

    agent = asyncio.run(asyncio.wait_for(go(), 30))
    return out.getvalue().splitlines(), agent


def test_503_502_504_and_resets_are_ridden_out_403_and_409_are_not(tmp_path: Path) -> None:
    wire = PollScript(["e1", (503, "hub_shutting_down"), "reset", (502, "http_502"), (504, "http_504"), "e1",
                       (409, "runner_instance_changed"), "e2"])  # fmt: skip
    lines, agent = run_agent(tmp_path, wire)
    assert lines == ["runner connected", "runner disconnected: runner_instance_changed", "runner connected"]
    assert agent.polls_ridden_out == 4
    assert wire.resets[:7] == [True] + [False] * 6, "ridden-out polls keep the state; after the 409 a reset poll"
    assert wire.resets[7] is True


def test_a_new_epoch_after_ridden_out_failures_is_a_local_disconnect(tmp_path: Path) -> None:
    lines, agent = run_agent(tmp_path, PollScript(["e1", "reset", "e2"]))
    assert lines == ["runner connected", "runner connected"], "the new epoch: the old sessions ended"
    assert agent.polls_ridden_out == 1 and agent.disconnects == 3, "connected, the new epoch, the stop"


def test_failures_are_ridden_out_only_within_the_window_from_the_last_good_poll_s_send(tmp_path: Path) -> None:
    # each poll is sent 6 s after the previous one: the good one at 0, failures answered at 12 and 18 (within 20 s of
    # its send), the one at 24 is not: a local disconnect, then a reset poll (a new state, e2)
    lines, agent = run_agent(tmp_path, PollScript(["e1", "reset", "reset", "reset", "e2"], step=6.0))
    assert agent.polls_ridden_out == 2
    assert lines == ["runner connected", "runner disconnected: transport", "runner connected"]


def test_a_failed_post_names_the_epoch_it_was_sent_under() -> None:
    wire = ScriptedWire(failures=1, failure="503")
    hub = polled(wire)
    with pytest.raises(HubError) as info:
        asyncio.run(hub.post("admit", "e7", {"id": "c1"}))
    assert info.value.epoch == "e7"


def test_a_late_failure_of_an_ended_connection_does_not_disconnect_the_current_one(tmp_path: Path) -> None:
    """A post of epoch e1 retried into a hub restarted meanwhile is answered runner_epoch_changed while the runner
    already runs under e2: that connection ended already; the current one stays (a regression: it was ended)."""
    config = parse_config({"protocol": 1, "serverURL": "http://127.0.0.1:9", "runnerId": str(uuid.uuid4()),
                           "token": "t" * 43, "allowedProfiles": ["default"]})  # fmt: skip
    wire = PollScript(["e1", "e2"])

    async def go() -> tuple[bool, bool]:
        with Receipts(tmp_path / "receipts.sqlite3", ManualClock()) as receipts:
            agent = Agent(config, receipts, ManualClock(), out=io.StringIO(), hub_wire=wire,
                          monotonic=lambda: wire.now)  # fmt: skip
            run = asyncio.get_running_loop().create_task(agent.run())
            while wire.script or not agent.connected:
                await asyncio.sleep(0.01)
            assert agent.server_epoch == "e2"
            await agent._hub_error(HubError(409, "runner_epoch_changed", "x", epoch="e1"))
            kept = agent.connected
            await agent._hub_error(HubError(409, "runner_epoch_changed", "x", epoch="e2"))
            ended = not agent.connected
            agent.request_stop()
            await run
            return kept, ended

    assert asyncio.run(asyncio.wait_for(go(), 30)) == (True, True)
