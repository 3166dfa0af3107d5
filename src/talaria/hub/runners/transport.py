"""The seam between the runner machine API (and the hub operations that send commands) and where connection states
and the command queue live (scale.md 2.6, 3): ``RunnerHub`` keeps them in one process's memory (SQLite: one hub),
``SharedRunnerHub`` in PostgreSQL tables, so that any replica serves any runner request. The conformance tests of
``tests/integration/test_runner_transport.py`` run against both.

Calls that change a state or the queue are coroutines (the shared one runs them on worker threads); views are
plain calls, each at most one primary-key read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import AccountRef, ChannelRow, CommandView, ConnState, Gateway, Grant
from talaria.hub.runners.validity import Validity
from talaria.lifecycle.records import LeaseRef

Observer = Callable[[str, float | None], None]  # (outcome, round-trip seconds or None)


@dataclass(frozen=True)
class JobHeld:
    """An adoption for the job its dispatcher holds under ``lease`` (scale.md 4.4)."""

    job_id: str
    lease: LeaseRef


@dataclass(frozen=True)
class TurnHeld:
    """An adoption for the chat turn whose ``turn_lease`` replica ``holder`` holds at ``counter`` (scale.md 4.3)."""

    turn_id: str
    holder: str
    counter: int


Holding = JobHeld | TurnHeld  # what an adoption is conditional on: the owner's token


class RunnerTransport(Protocol):
    clock: Clock
    validity: Validity
    on_draining: list[Callable[[str], None]]  # called on the loop with a runner id when this hub starts its drain

    async def enter(
        self, runner_id: str, instance: str, *, poll: bool, reset: bool, epoch: str | None, features: str | None,
        version: str | None = None, draining: bool = False,
    ) -> tuple[ConnState, bool]:  # fmt: skip
        """Gates 3-8 of runner-protocol.md 4 for one request: the state, and whether this request created it.
        ``features`` and ``version`` (the runner's, from its ``User-Agent``) come with a poll and replace the
        state's. ``draining`` (``X-Runner-Draining: 1``) starts the state's drain if it has not begun."""
        ...

    async def drain(self, runner_id: str) -> bool:
        """Start the drain of the runner's current state (operations.md 3.1; again: nothing new) and wake its held
        poll, whose answer then carries ``drain: true``. False when the runner is not connected."""
        ...

    def end_hold(self, runner_id: str) -> None:
        """Answer a poll of the runner held on this process now, with what is due (an admin asked it to rotate its
        token, operations.md 4.1). A poll held on another replica ends with its hold."""
        ...

    def draining_count(self) -> int:
        """Connection states that drain (``talaria_runners_draining``)."""
        ...

    def held_count(self) -> int:
        """Polls this process holds now (``talaria_runner_polls_held``)."""
        ...

    def accepts_work(self, runner_id: str) -> bool:
        """Connected and not draining: new work (a job, a chat turn) may start there."""
        ...

    async def poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        """The poll's answer (6.2): at once for a new state or a due batch, else held until woken or 15 s."""
        ...

    async def send(
        self, runner_id: str, kind: str, payload: dict[str, Any], *, account: AccountRef | None,
        profile: str | None, connection_id: str | None = None, grant_id: str | None = None,
        valid: bool | None = None, owner_counter: int | None = None,
    ) -> Any:  # fmt: skip
        """Queue one command and wait for its one outcome: the reply, or a ``TalariaError`` (6.1). A command on a
        gateway sent under ``owner_counter`` is refused (409 ``runner_connection_closed``) once another owner adopted
        the gateway (scale.md 4.3), and so is its ``admit``."""
        ...

    async def complete(self, state: ConnState, command_id: str, body: dict[str, Any]) -> None:
        """A ``result`` post: the command's one outcome; unknown, settled or other-epoch ids change nothing."""
        ...

    async def pending_command(self, state: ConnState, command_id: str) -> CommandView | None:
        """A command of this state still waiting for its outcome (``admit`` checks it), or None."""
        ...

    async def add_channel(self, state: ConnState, channel: Gateway | Grant) -> None:
        """Hold a hub-side gateway or grant of this state (and its row) before its opening command is sent."""
        ...

    async def channel(self, state: ConnState, kind: str, channel_id: str) -> ChannelRow | None:
        """An open ``gateway`` or ``grant`` of this state as this hub process sees it (admit, event, tool)."""
        ...

    async def end_channel(
        self, state: ConnState, kind: str, channel_id: str, *, revoked: bool = False, owner_counter: int | None = None
    ) -> None:
        """Close a gateway or grant on the hub side: its owner sees it closed (``revoked``: because its account lost
        its access); a gateway's pending commands (but its own close) fail 409. With ``owner_counter``, a gateway
        closes only while its owner counter is still that one (an owner it was adopted from closes nothing)."""
        ...

    async def adopt_gateway(
        self, runner_id: str, connection_id: str, account: AccountRef, *, held: Holding, after_seq: int,
        runtime_id: str, profile: str,
    ) -> Gateway | None:  # fmt: skip
        """Take over an open gateway of the runner's current state for the job or chat turn ``held`` (scale.md
        4.4): owner counter + 1, its frames after ``after_seq`` replayed into the returned gateway's queue (its
        ``replay_to`` is the last one stored then), ``runtime_id`` owned by it under ``profile``; returns once no
        command its previous owner sent on it is pending. None when the gateway is closed, of another state or
        runner, ``held`` no longer holds, or this transport's channels die with their hub (SQLite)."""
        ...

    async def revoke_gateway(self, state: ConnState, connection_id: str) -> None:
        """Mark a gateway's account as having lost its access (its owner stops the turn when the gateway ends)."""
        ...

    async def describe_grant(self, state: ConnState, grant_id: str, tools: dict[str, Any]) -> None:
        """Record what runs the grant's calls (``Channels.tool_kinds``), so any hub process can run them."""
        ...

    async def revoke_grant(self, state: ConnState, grant_id: str) -> None:
        """A check found the grant's account without access: no further call runs, its owner stops the turn."""
        ...

    async def call_once(
        self, state: ConnState, grant_id: str, call_id: str, fingerprint: str, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run ``run`` once for the grant's ``callId`` wherever the calls come: a duplicate gets the first outcome
        (waiting while it runs), other arguments 409 ``idempotency_conflict``, the 129th call 429
        ``runner_call_limit``. ``run`` raises only ``TalariaError``."""
        ...

    async def record_event(
        self, state: ConnState, connection_id: str, seq: int | None, frame: dict[str, Any] | None
    ) -> None:
        """Store an accepted frame (``None``: the runner's close marker) for the gateway's owner, at most once per
        ``seq`` (failover-v1; without one, next in line): a stored ``seq`` changes nothing; 410 when the gateway
        is not open, 409 ``runner_event_gap`` when an earlier one is missing."""
        ...

    async def disconnect(self, runner_id: str, reason: str) -> None:
        """End the runner's state (6.3): its waiting poll, its commands, its channels."""
        ...

    async def tick(self) -> None:
        """One watchdog pass: end every state unseen for more than 35 s."""
        ...

    def start(self) -> None: ...

    def begin_shutdown(self) -> None:
        """Held polls answer ``hub_shutting_down`` at once."""
        ...

    async def stop(self) -> None: ...

    # --- views ----------------------------------------------------------------------------------------------

    def state_of(self, runner_id: str) -> ConnState | None:
        """The runner's connection state, or None while it is not connected."""
        ...

    def is_connected(self, runner_id: str) -> bool: ...

    def connected_ids(self) -> list[str]: ...

    def connected_count(self) -> int: ...

    def pending_count(self) -> int: ...

    def summary(self, runner_id: str) -> dict[str, Any]:
        """``online``, ``lastSeenAt``, ``connectedAt``, ``features``, ``runnerVersion``, ``draining`` and
        ``drainingSince`` for the nodes page and API."""
        ...

    def pending_wires(self, runner_id: str) -> list[dict[str, Any]]:
        """The wire form of the runner's pending commands, in enqueue order."""
        ...

    def has_waiter(self, runner_id: str) -> bool:
        """Whether this hub process holds a poll of the runner now."""
        ...


GATES = {
    "runner_instance_changed": "this runner instance has no current connection state",
    "runner_instance_retired": "this runner instance was replaced; it stops for good",
    "runner_instance_limit": "too many replaced instances; register the runner again",
    "runner_epoch_changed": "the connection state changed; poll again",
}


def refused(code: str) -> TalariaError:
    """A refusal of gates 3-8, worded alike by both transports."""
    return TalariaError(code, GATES[code])


def draining() -> TalariaError:
    return TalariaError("runner_draining", "the execution node is draining; it takes no new work")


def gateway_closed(what: str = "the gateway connection is closed") -> TalariaError:
    return TalariaError("runner_connection_closed", what, status=409)


def adopted_elsewhere() -> TalariaError:
    return TalariaError("runner_connection_closed", "another owner took this gateway over", status=409)


def connection_gone() -> TalariaError:
    return TalariaError("runner_connection_closed", "no such open connection", status=410)


def event_gap(expected: int) -> TalariaError:
    return TalariaError("runner_event_gap", f"event {expected} of this connection is missing")
