"""The seam between the runner machine API (and the hub operations that send commands) and where connection states
and the command queue live (scale.md 2.6, 3): ``RunnerHub`` keeps them in one process's memory (SQLite: one hub),
``SharedRunnerHub`` in PostgreSQL tables, so that any replica serves any runner request. The conformance tests of
``tests/integration/test_runner_transport.py`` run against both.

Calls that change a state or the queue are coroutines (the shared one runs them on worker threads); views are
plain calls, each at most one primary-key read.
"""

from __future__ import annotations

from typing import Any, Protocol

from talaria.clock import Clock
from talaria.hub.runners.connection_state import AccountRef, CommandView, ConnState
from talaria.hub.runners.validity import Validity


class RunnerTransport(Protocol):
    clock: Clock
    validity: Validity

    async def enter(
        self, runner_id: str, instance: str, *, poll: bool, reset: bool, epoch: str | None, features: str | None
    ) -> tuple[ConnState, bool]:
        """Gates 3-8 of runner-protocol.md 4 for one request: the state, and whether this request created it."""
        ...

    async def poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        """The poll's answer (6.2): at once for a new state or a due batch, else held until woken or 15 s."""
        ...

    async def send(
        self, runner_id: str, kind: str, payload: dict[str, Any], *, account: AccountRef | None,
        profile: str | None, connection_id: str | None = None, grant_id: str | None = None,
        valid: bool | None = None,
    ) -> Any:  # fmt: skip
        """Queue one command and wait for its one outcome: the reply, or a ``TalariaError`` (6.1)."""
        ...

    async def complete(self, state: ConnState, command_id: str, body: dict[str, Any]) -> None:
        """A ``result`` post: the command's one outcome; unknown, settled or other-epoch ids change nothing."""
        ...

    async def pending_command(self, state: ConnState, command_id: str) -> CommandView | None:
        """A command of this state still waiting for its outcome (``admit`` checks it), or None."""
        ...

    async def fail_gateway(self, state: ConnState, connection_id: str) -> None:
        """Fail the pending commands of a gateway closed on the hub side (but its own close) with 409."""
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
        """``online``, ``lastSeenAt``, ``connectedAt`` and ``features`` for the nodes page and API."""
        ...

    def pending_wires(self, runner_id: str) -> list[dict[str, Any]]:
        """The wire form of the runner's pending commands, in enqueue order."""
        ...

    def has_waiter(self, runner_id: str) -> bool:
        """Whether this hub process holds a poll of the runner now."""
        ...
