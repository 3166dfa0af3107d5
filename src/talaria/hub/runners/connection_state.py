"""In-memory state of runner connections on one hub process (runner-protocol.md 5.1, 6)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class AccountRef:
    """The account that caused a command, with the ``auth_version`` captured when it was created."""

    username: str
    tenant: str
    auth_version: int


class CommandView(Protocol):
    """What ``admit`` reads of a pending command, in memory or from its row."""

    @property
    def kind(self) -> str: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def expires_at(self) -> int: ...
    @property
    def account(self) -> AccountRef | None: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def connection_id(self) -> str | None: ...
    @property
    def grant_id(self) -> str | None: ...
    @property
    def stale_owner(self) -> bool:
        """Sent on a gateway under an owner counter it no longer has (another replica adopted it, scale.md 4.3)."""
        ...


@dataclass
class Command:
    id: str
    kind: str
    payload: dict[str, Any]
    expires_at: int
    runner_id: str
    account: AccountRef | None
    profile: str | None
    size: int
    enqueued_at: int
    future: asyncio.Future[Any]
    connection_id: str | None = None
    grant_id: str | None = None
    delivered: int = 0
    next_delivery: int = 0
    timer: asyncio.TimerHandle | None = None
    stale_owner: bool = False  # one hub owns every gateway it opened: never stale
    traceparent: str | None = None  # the work's trace (operations.md 5.5), sent to trace-v1 runners only

    def wire(self, traced: bool = True) -> dict[str, Any]:
        wire = {"id": self.id, "kind": self.kind, "payload": self.payload, "expiresAt": self.expires_at}
        if traced and self.traceparent is not None:
            wire["traceparent"] = self.traceparent
        return wire


@dataclass
class Gateway:
    """A hub-side gateway connection: owned by one purpose, fed by the runner's ``event`` posts."""

    id: str
    runner_id: str
    account: AccountRef
    cleanup_only: bool
    bound_stored_id: str | None = None
    profiles: dict[str, str] = field(default_factory=dict)  # runtime session id -> profile
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    open: bool = True
    revoked: bool = False
    last_seq: int = 0  # the last event number stored (failover-v1); 0 before the first
    read_seq: int = 0  # the event number of the last frame its reader took from ``events`` (driver.next_frame)
    replay_to: int = 0  # adopted: the last event number stored when this owner adopted it (scale.md 4.4)
    owner_counter: int = 1  # + 1 at each adoption by another owner (scale.md 4.4); commands carry it


ToolExecutor = Callable[[str, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class EncodedResult:
    """A tool's result already as its JSON text (team tools: compact, ids first, the ledger's exact bytes); the
    ``tool`` op answers it as ``{"result": <text>}`` without re-encoding, so the key order reaches the model."""

    text: str


@dataclass
class Grant:
    id: str
    runner_id: str
    account: AccountRef
    profile: str
    work_id: str
    executor: ToolExecutor
    turn_active: Callable[[], bool]
    open: bool = True
    calls: dict[str, tuple[str, asyncio.Future[Any]]] = field(default_factory=dict)
    # set when a check found the grant's account without access; the turn that owns the grant stops
    revoked: asyncio.Event = field(default_factory=asyncio.Event)
    # set when a tool refused the round itself (team_tools_forbidden): later calls are 410, grant.close follows,
    # the turn goes on without tools (team-tools.md 5 "Revocation")
    closing: bool = False


@dataclass(frozen=True)
class ChannelRow:
    """An open gateway or grant as a hub process sees it, whichever process owns it: what ``admit``, ``event`` and
    ``tool`` check, and the owner's object when it is on this process."""

    id: str
    account: AccountRef
    cleanup_only: bool = False
    profile: str | None = None
    here: Gateway | Grant | None = None
    revoked: bool = False  # a grant's: a check elsewhere found its account without access
    tools: dict[str, Any] | None = None  # a grant's: what runs its calls on a process other than its owner


@dataclass
class ConnState:
    runner_id: str
    instance: str
    epoch: str
    created: int
    seen: int
    features: frozenset[str] = frozenset()
    version: str | None = None  # the runner's release, from the User-Agent of its polls (operations.md 1.2)
    draining_since: int | None = None  # a drain of this state began (operations.md 3): no new work
    queue: dict[str, Command] = field(default_factory=dict)
    pending_bytes: int = 0
    waiter: asyncio.Future[str] | None = None
    gateways: dict[str, Gateway] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    poll_token: str | None = None  # the shared hub's: this request's poll, current until a newer one (scale.md 3.3)
