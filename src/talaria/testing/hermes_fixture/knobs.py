"""The fixture's knobs: plain attributes a test sets (timings, limits, plugin answers) and rule lists that the
fixture's methods fill (failures, delays, drops, scripted replies). The rule lists are read and changed only under
the fixture's condition variable; plain attributes are read once where they apply.

Rules take ``times``: how many matches they serve before they are removed (``None``: until ``reset_knobs``).
Among the rules that match, the one added last wins.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

HERMES_VERSION = "0.19.0"
DESKTOP_CONTRACT = 4


def default_capabilities() -> dict[str, Any]:
    """What Talaria's plugin answers on a ready 0.19.0 (hermes.md 8)."""
    return {
        "version": 1,
        "plugin_version": "1",
        "hermes_version": HERMES_VERSION,
        "ready": True,
        "in_process": True,
        "native_tools": True,
        "tool_plugin_loaded": True,
        "turn_isolation": False,
        "tool_search": "off",
        "missing": [],
    }


@dataclass
class _Rule:
    remaining: int | None

    def consume(self) -> bool:
        """Count one use; True when the rule is spent."""
        if self.remaining is None:
            return False
        self.remaining -= 1
        return self.remaining <= 0


@dataclass
class MethodFailure(_Rule):
    method: str
    code: int
    message: str


@dataclass
class MethodDelay(_Rule):
    method: str
    seconds: float | None  # None: never answered


@dataclass
class MethodDrop(_Rule):
    method: str
    after_handling: bool


@dataclass
class RouteFailure(_Rule):
    pattern: str
    status: int
    body: Any


@dataclass
class RouteGate:
    """A held request: ``reached`` is set when it arrives; it is handled once ``release`` is called (or when its
    rule's seconds have passed)."""

    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class RouteDelay(_Rule):
    pattern: str
    seconds: float
    gate: RouteGate | None = None


@dataclass
class ReplyRule(_Rule):
    substring: str
    text: str


@dataclass
class ApprovalRule(_Rule):
    substring: str
    payload: dict[str, Any]


@dataclass
class ClarifyRule(_Rule):
    substring: str
    question: str
    choices: list[str]


@dataclass
class TurnFailure(_Rule):
    substring: str
    message: str
    event_only: bool = False  # an error event and no message.complete (0.19.0's agent initialization timeout)


@dataclass
class CompressRule(_Rule):
    substring: str


@dataclass
class DeltaDelayRule(_Rule):
    substring: str
    seconds: float


R = TypeVar("R", bound=_Rule)


class RuleList(Generic[R]):
    """Rules of one kind; ``take`` finds the newest match and counts its use."""

    def __init__(self) -> None:
        self.items: list[R] = []

    def add(self, rule: R) -> None:
        self.items.append(rule)

    def clear(self) -> None:
        self.items.clear()

    def take(self, key: str, field_name: str, *, glob: bool = False, contains: bool = False) -> R | None:
        for rule in reversed(self.items):
            value = str(getattr(rule, field_name))
            if glob:
                hit = fnmatch.fnmatchcase(key, value)
            elif contains:
                hit = value in key
            else:
                hit = value == key
            if hit:
                if rule.consume():
                    self.items.remove(rule)
                return rule
        return None


@dataclass
class Knobs:
    """Every knob of one fixture. Timings are seconds; defaults behave like an idle, healthy Hermes 0.19.0."""

    # --- /api/ws
    ready_delay: float = 0.0
    """Delay between accepting a WebSocket and sending ``gateway.ready``."""
    send_ready: bool = True
    """False: ``gateway.ready`` is never sent (requests are still answered)."""
    drop_after_frames: int | None = None
    """Connections opened while set are dropped (TCP abort, no close frame) once they have sent this many frames;
    ``gateway.ready`` is frame 1."""
    # --- turns
    delta_count: int = 3
    """``message.delta`` events per reply (fewer when the reply is shorter)."""
    delta_delay: float = 0.0
    """Delay before each ``message.delta``; a turn in flight for interrupt and recovery tests."""
    agent_build_delay: float = 0.05
    """Delay after ``session.create`` / cold ``session.resume`` before the agent is built and ``session.info`` sent."""
    persist_delay: float = 0.0
    """Delay between a ``prompt.submit`` answer and the user row (a first turn's stored id is unknown until then)."""
    interrupt_delay: float = 0.0
    end_info_delay: float = 0.0  # message.complete -> the end-of-turn session.info
    """Delay between ``session.interrupt`` and the ``message.complete`` with status ``interrupted``."""
    clarify_timeout: float = 300.0
    """How long a ``clarify.request`` or ``approval.request`` waits for its answer (then empty / none)."""
    # --- sessions
    reap_grace: float = 20.0
    """An idle session whose WebSocket went away is closed after this grace (checked once)."""
    max_sessions: int | None = None
    """Live sessions allowed in the process; one more ``session.create``/cold resume gives 4090."""
    # --- REST
    dashboard_page: bool = False
    """True: ``GET /`` serves the page with ``window.__HERMES_SESSION_TOKEN__`` (``hermes dashboard``); False: 404
    (``hermes serve``)."""
    status_overrides: dict[str, Any] = field(default_factory=dict)
    """Merged into the ``/api/status`` body (e.g. ``{"version": "0.20.0"}``)."""
    plugin_enabled: bool = True
    """False: every ``/api/plugins/talaria/*`` route answers 404 ``Plugin not found`` (plugin not enabled)."""
    capabilities: dict[str, Any] = field(default_factory=default_capabilities)
    """The ``/api/plugins/talaria/capabilities`` body."""
    bind_native_tools: bool = True
    """The ``native_tools`` field of a successful bind answer."""
    bind_tools: list[str] = field(default_factory=list)
    """The ``tools`` field of a successful bind answer."""
    max_download_bytes: int = 100 * 1024 * 1024
    """``/api/files/download`` answers 413 above this size."""
    # --- rule lists (filled through the fixture's methods)
    method_failures: RuleList[MethodFailure] = field(default_factory=RuleList)
    method_delays: RuleList[MethodDelay] = field(default_factory=RuleList)
    method_drops: RuleList[MethodDrop] = field(default_factory=RuleList)
    route_failures: RuleList[RouteFailure] = field(default_factory=RuleList)
    route_delays: RuleList[RouteDelay] = field(default_factory=RuleList)
    replies: RuleList[ReplyRule] = field(default_factory=RuleList)
    approvals: RuleList[ApprovalRule] = field(default_factory=RuleList)
    clarifications: RuleList[ClarifyRule] = field(default_factory=RuleList)
    turn_failures: RuleList[TurnFailure] = field(default_factory=RuleList)
    compressions: RuleList[CompressRule] = field(default_factory=RuleList)
    delta_delays: RuleList[DeltaDelayRule] = field(default_factory=RuleList)

    def clear_rules(self) -> None:
        every: tuple[RuleList[Any], ...] = (
            self.method_failures,
            self.method_delays,
            self.method_drops,
            self.route_failures,
            self.route_delays,
            self.replies,
            self.approvals,
            self.clarifications,
            self.turn_failures,
            self.compressions,
        )
        for rules in every:
            rules.clear()

    def delta_delay_of(self, text: str) -> float:
        """The delay before each delta of the turn on ``text``: the newest ``delta_delay_for`` rule whose substring
        is in it, else ``delta_delay``."""
        rule = self.delta_delays.take(text, "substring", contains=True)
        return rule.seconds if rule is not None else self.delta_delay

    def reply_to(self, text: str) -> str:
        """The deterministic reply: the newest ``reply_for`` rule whose substring is in ``text``, else an echo."""
        rule = self.replies.take(text, "substring", contains=True)
        return rule.text if rule is not None else "echo: " + text


def split_reply(text: str, count: int) -> list[str]:
    """``text`` in at most ``count`` non-empty pieces whose concatenation is ``text``."""
    if not text:
        return []
    count = max(1, min(count, len(text)))
    size, extra = divmod(len(text), count)
    pieces: list[str] = []
    start = 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces
