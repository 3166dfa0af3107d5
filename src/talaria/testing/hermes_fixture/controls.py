"""The rule knobs and the thread-safe reads of ``HermesFixture`` (callable from the test thread at any time).

Reads return copies taken under the fixture's condition variable; ``wait_for`` waits on it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from talaria.testing.hermes_fixture.knobs import (
    ApprovalRule,
    ClarifyRule,
    CompressRule,
    DeltaDelayRule,
    Knobs,
    MethodDelay,
    MethodDrop,
    MethodFailure,
    ReplyRule,
    RouteDelay,
    RouteFailure,
    RouteGate,
    TurnFailure,
)
from talaria.testing.hermes_fixture.state import (
    FixtureState,
    LiveSession,
    RequestRecord,
    RpcRecord,
    SessionView,
    TurnRecord,
)

T = TypeVar("T")

APPROVAL_CHOICES = ("once", "session", "always", "deny")


def view_of(session: LiveSession) -> SessionView:
    return SessionView(
        runtime_id=session.runtime_id,
        stored_id=session.stored_id,
        profile=session.profile,
        status=session.status,
        running=session.running,
        attached=session.sink is not None,
        connection=session.sink.id if session.sink is not None else None,
        close_on_disconnect=session.close_on_disconnect,
    )


class FixtureControls:
    _state: FixtureState
    _initial_knobs: Knobs

    # --- rule knobs (``times``: matches served before the rule goes; None: until ``reset_knobs``)

    def fail_method(
        self, method: str, code: int = 5000, message: str = "internal failure", *, times: int | None = None
    ) -> None:
        """Answer ``method`` with a JSON-RPC error instead of running it."""
        self._add(lambda k: k.method_failures.add(MethodFailure(times, method, code, message)))

    def delay_method(self, method: str, seconds: float | None, *, times: int | None = None) -> None:
        """Run and answer ``method`` only after ``seconds`` (later requests overtake it); None: never answer."""
        self._add(lambda k: k.method_delays.add(MethodDelay(times, method, seconds)))

    def drop_on_method(self, method: str, *, after_handling: bool = True, times: int | None = 1) -> None:
        """Abort the connection when ``method`` arrives: after running it without answering (``after_handling``),
        or before running it."""
        self._add(lambda k: k.method_drops.add(MethodDrop(times, method, after_handling)))

    def fail_route(self, pattern: str, status: int, body: Any = None, *, times: int | None = None) -> None:
        """Answer HTTP requests whose path matches the glob ``pattern`` with ``status`` (after the guards)."""
        self._add(lambda k: k.route_failures.add(RouteFailure(times, pattern, status, body)))

    def delay_route(self, pattern: str, seconds: float, *, times: int | None = None) -> None:
        """Wait ``seconds`` before handling HTTP requests whose path matches the glob ``pattern`` (``"*"``: all)."""
        self._add(lambda k: k.route_delays.add(RouteDelay(times, pattern, seconds)))

    def hold_route(self, pattern: str, *, seconds: float = 30.0, times: int | None = 1) -> RouteGate:
        """Hold HTTP requests whose path matches ``pattern`` until the returned gate is released (at most
        ``seconds``); the gate's ``reached`` tells when one arrived, so a test can act while it waits."""
        gate = RouteGate()
        self._add(lambda k: k.route_delays.add(RouteDelay(times, pattern, seconds, gate)))
        return gate

    def reply_for(self, substring: str, text: str, *, times: int | None = None) -> None:
        """Reply ``text`` to prompts containing ``substring`` (default reply: ``"echo: " + prompt``)."""
        self._add(lambda k: k.replies.add(ReplyRule(times, substring, text)))

    def approval_for(
        self,
        substring: str,
        *,
        command: str = "rm -rf build",
        description: str = "dangerous command",
        choices: Sequence[str] = APPROVAL_CHOICES,
        times: int | None = None,
    ) -> None:
        """Turns on prompts containing ``substring`` send ``approval.request`` after ``message.start`` and wait
        for ``approval.respond`` (or an interrupt)."""
        payload = {"command": command, "description": description, "choices": list(choices)}
        self._add(lambda k: k.approvals.add(ApprovalRule(times, substring, payload)))

    def clarify_for(
        self, substring: str, question: str, choices: Sequence[str] = (), *, times: int | None = None
    ) -> None:
        """Turns on prompts containing ``substring`` send ``clarify.request {request_id, question, choices}`` and
        wait for ``clarify.respond`` (at most ``knobs.clarify_timeout``)."""
        self._add(lambda k: k.clarifications.add(ClarifyRule(times, substring, question, list(choices))))

    def fail_turn_for(self, substring: str, message: str, *, times: int | None = None) -> None:
        """Turns on prompts containing ``substring`` end with ``message.complete {status: "error"}``, no reply row."""
        self._add(lambda k: k.turn_failures.add(TurnFailure(times, substring, message)))

    def error_event_for(self, substring: str, message: str, *, times: int | None = None) -> None:
        """Turns on prompts containing ``substring`` end with ``error {message}`` and no ``message.complete`` (as
        Hermes 0.19.0 ends a prompt whose agent did not initialise in time), no reply row."""
        self._add(lambda k: k.turn_failures.add(TurnFailure(times, substring, message, event_only=True)))

    def delta_delay_for(self, substring: str, seconds: float) -> None:
        """Turns on prompts containing ``substring`` wait ``seconds`` before each delta (instead of
        ``knobs.delta_delay``), re-read while it waits: a later rule of the same substring (0: go on) changes a
        running turn's wait."""
        self._add(lambda k: k.delta_delays.add(DeltaDelayRule(None, substring, seconds)))

    def compress_on(self, substring: str, *, times: int | None = 1) -> None:
        """A turn on a prompt containing ``substring`` first compresses: the stored session continues in a new one
        (same runtime id); the turn's rows and ``session.info`` carry the new stored id."""
        self._add(lambda k: k.compressions.add(CompressRule(times, substring)))

    def reset_knobs(self) -> None:
        """Every knob back to what the fixture was constructed with (the ``knobs`` object stays the same)."""
        with self._state.cond:
            fresh = copy.deepcopy(self._initial_knobs)
            for field in dataclasses.fields(Knobs):
                setattr(self._state.knobs, field.name, getattr(fresh, field.name))
            self._state.changed()

    def _add(self, change: Callable[[Knobs], None]) -> None:
        with self._state.cond:
            change(self._state.knobs)
            self._state.changed()

    # --- reads

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0) -> T:
        """Wait until ``predicate()`` is truthy (re-checked on every change of the fixture) and return its value;
        TimeoutError after ``timeout`` seconds."""
        with self._state.cond:
            value = self._state.cond.wait_for(predicate, timeout)
        if not value:
            raise TimeoutError(f"the Hermes fixture did not reach the condition within {timeout} s")
        return value

    def requests(self, path: str | None = None) -> list[RequestRecord]:
        """HTTP requests and WebSocket upgrades in arrival order (only ``path`` if given)."""
        with self._state.cond:
            return [dataclasses.replace(r) for r in self._state.requests if path is None or r.path == path]

    def rpc_requests(self, method: str | None = None) -> list[RpcRecord]:
        with self._state.cond:
            return [r for r in self._state.rpc_log if method is None or r.method == method]

    def turns(self) -> list[TurnRecord]:
        with self._state.cond:
            return [dataclasses.replace(t) for t in self._state.turns]

    def prompt_count(self, text: str) -> int:
        """How many turns started on a prompt containing ``text`` (a queued prompt counts when it starts)."""
        with self._state.cond:
            return sum(1 for t in self._state.turns if text in t.text)

    def transcript(self, stored_id: str, *, profile: str = "default") -> list[dict[str, Any]]:
        """The stored rows of a session (REST's view without the compression redirect); [] when unknown."""
        with self._state.cond:
            stored = self._state.stored.get((profile, stored_id))
            return [dict(r) for r in stored.rows] if stored is not None else []

    def stored_ids(self, *, profile: str = "default") -> list[str]:
        with self._state.cond:
            return [sid for (p, sid) in self._state.stored if p == profile]

    def live_sessions(self) -> list[SessionView]:
        with self._state.cond:
            return [view_of(s) for s in self._state.live.values()]

    def session(self, runtime_id: str) -> SessionView | None:
        with self._state.cond:
            live = self._state.live.get(runtime_id)
            return view_of(live) if live is not None else None

    def binds(self) -> list[dict[str, Any]]:
        """Every body POSTed to ``/api/plugins/talaria/bind``, refused ones included."""
        with self._state.cond:
            return [dict(b) for b in self._state.binds]

    def unbinds(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [dict(b) for b in self._state.unbinds]

    def bindings(self) -> dict[str, dict[str, Any]]:
        """The live bindings by runtime id (the bind body that made or renewed each)."""
        with self._state.cond:
            return {k: dict(v) for k, v in self._state.bindings.items()}

    def steers(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [dict(s) for s in self._state.steers]

    def approval_choices(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [dict(a) for a in self._state.approval_choices]

    def clarify_answers(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [dict(a) for a in self._state.clarify_answers]

    def attachments(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [dict(a) for a in self._state.attachments]

    def connection_count(self) -> int:
        """Open ``/api/ws`` connections."""
        with self._state.cond:
            return len(self._state.connections)

    def connections_opened(self) -> int:
        with self._state.cond:
            return self._state.connections_opened

    def internal_errors(self) -> list[str]:
        """Tracebacks of fixture bugs (answered as -32603 or ending a turn); a test may assert it is empty."""
        with self._state.cond:
            return list(self._state.internal_errors)
