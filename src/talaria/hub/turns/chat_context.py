"""What chat's turn engine shares (chat.md 5): its parts (store, clock, settings, audit key, the live stream,
accounts, access, runners, the driver), the state of its live turns (drafts, streams, stop events, turns per
runner), and the writes every step ends with: commit-then-emit under the conversation's event lock, and a turn's
end with its reply, ``chat.turn.ended`` and the events of that end."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

import structlog

from talaria.accounts.service import Accounts
from talaria.chat.bots import Allowed
from talaria.chat.records import ChatTurn, approval_json, message_json, turn_json
from talaria.chat.turn_writes import Ended, NewMessage, end_turn, get_turn, lock_turn
from talaria.chat.usage import public as public_usage
from talaria.chat.usage import turn_usage
from talaria.clock import Clock
from talaria.errors import RETRIED_CONFLICTS, StoreConflict, TalariaError
from talaria.hub.chat.stream_events import StreamEvents
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.runners.slots import LocalSlots, RunnerSlots
from talaria.hub.runners.transport import RunnerTransport
from talaria.hub.timings import HubTimings
from talaria.hub.turns.chat_channels import KeptChannels
from talaria.hub.turns.chat_frames import Draft, TurnStream
from talaria.hub.turns.driver import ACCESS_REVOKED, STOPPED, TURN_TIMEOUT, TurnDriver, TurnResult
from talaria.hub.turns.turn_leases import LeaseLost, LocalTurnLeases, TurnLeases
from talaria.lifecycle.actor import Actor, account_principal
from talaria.lifecycle.audit_key import AuditKey
from talaria.settings import Settings
from talaria.store.interface import Row, Signals, Store, Tx
from talaria.teams.calls import TeamToolCalls

log = structlog.get_logger("talaria.chat")

UNCERTAIN = "runner_command_uncertain"
TURN_CHANNEL = "talaria_turn"  # a turn stopped or ended by another replica than the one driving it


@dataclass(frozen=True)
class Place:
    """Where a turn runs: its conversation's row (with the bot) and the source's runner now."""

    conversation: Row
    runner: RunnerRecord | None


class ChatContext:
    def __init__(
        self, *, store: Store, clock: Clock, settings: Settings, key: AuditKey, accounts: Accounts,
        allowed: Allowed, registry: RunnerRegistry, runners: RunnerTransport, driver: TurnDriver, events: StreamEvents,
        timings: HubTimings, team_calls: TeamToolCalls | None = None, leases: TurnLeases | None = None,
        signals: Signals | None = None, slots: RunnerSlots | None = None,
    ) -> None:  # fmt: skip
        self.store, self.clock, self.settings, self.key = store, clock, settings, key
        self.accounts, self.allowed, self.registry, self.runners = accounts, allowed, registry, runners
        self.driver, self.events, self.timings = driver, events, timings
        self.team_calls = team_calls  # None while the team set is not installed (chat.md 5.9)
        self.leases = leases or LocalTurnLeases()  # which replica drives a turn (scale.md 4.3)
        self.signals = signals  # PostgreSQL replicas: talaria_turn wakes the owner of a turn changed elsewhere
        self.slots = slots or LocalSlots()  # chat.per_runner across replicas (scale.md 3.7)
        self.slot_of: dict[str, int] = {}  # the runner slot each turn holds while it runs here
        self.tokens: dict[str, int] = {}  # the lease token of each turn this hub drives
        self.lost: set[str] = set()  # turns whose lease another replica took: nothing more is written or sent
        self.drafts: dict[str, Draft] = {}
        self.running: dict[str, asyncio.Task[None]] = {}
        self.stops: dict[str, asyncio.Event] = {}
        self.per_runner: dict[str, int] = {}
        self.streams: dict[str, TurnStream] = {}
        self.kept = KeptChannels(driver.channels, settings.chat_channel_idle_s)
        driver.channels.runners.on_draining.append(self.kept.close_runner)  # idle channels close as a drain begins
        self.stopping = False
        self.draining = False  # the hub drains (operations.md 3.4): no turn goes on to its node until the restart
        self.waiting: set[str] = set()  # turns waiting for their node (not yet running there)
        self.scans = 0  # scans completed since start (tests wait for the first)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        if signals is not None:  # before the listener starts (with the runner hub), so it listens on this too
            signals.subscribe(TURN_CHANNEL, self._woken)

    def _woken(self, _turn_id: str) -> None:
        """``talaria_turn`` (the listener's thread): scan now."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._wake.set)

    def actor(self, tenant: str) -> Actor:
        return Actor(self.settings.lifecycle_dispatcher_principal, frozenset(), "in_process", tenant)

    @staticmethod
    def owner(turn: ChatTurn) -> Actor:
        """Chat.md 8: a stop's end is the owner's, through the web."""
        return Actor(account_principal(turn.tenant, turn.owner), frozenset(), "web", turn.tenant)

    def _turn(self, turn_id: str) -> ChatTurn:
        with self.store.read() as tx:
            return get_turn(tx, turn_id)

    def _place(self, turn: ChatTurn) -> Place:
        with self.store.read() as tx:
            row = tx.one("chat_conversation_by_id", id=turn.conversation_id)
        assert row is not None
        return Place(row, self.registry.for_source(turn.tenant, row["bot_source"]))

    def _still_allowed(self, turn: ChatTurn, conversation: Row) -> bool:
        account = self.accounts.get(turn.owner)
        if account is None or not account.enabled or account.auth_version != turn.auth_version:
            return False
        return self.allowed(account, conversation["bot_source"], conversation["bot_profile"])

    def _conversation_of(self, turn_id: str) -> str:
        return self._turn(turn_id).conversation_id

    def fence(self, tx: Tx, turn_id: str) -> None:
        """In a write of the turn's owner: ``LeaseLost`` once another replica drives the turn (scale.md 4.3)."""
        token = self.tokens.get(turn_id)
        if token is None:
            return
        try:
            self.leases.check(tx, turn_id, token)
        except LeaseLost:
            self.lost.add(turn_id)
            raise

    def _write(self, conversation_id: str, write: Any, *, fence: str | None = None) -> None:
        """Commit ``write(tx)`` with the events it returns (staged in its transaction, sent after its commit), under
        the conversation's event lock; ``fence``:
        the turn whose owner writes (``LeaseLost`` once that is no longer this hub). A transaction PostgreSQL gave up
        for a concurrent one runs ``write`` again (3 attempts in all), so ``write`` keeps nothing of a try but its
        return value."""
        with self.events.locked(conversation_id):
            for attempt in range(1, RETRIED_CONFLICTS + 1):
                try:
                    with self.store.write() as tx:
                        if fence is not None:
                            self.fence(tx, fence)
                        staged = self.events.stage(tx, conversation_id, write(tx))
                    break
                except StoreConflict:
                    if attempt == RETRIED_CONFLICTS:
                        raise
            self.events.send(staged)

    def _partial(self, stream: TurnStream) -> NewMessage | None:
        draft = stream.draft
        if not draft.text:
            return None
        return NewMessage(role="assistant", author=stream.bot_id, content=draft.text, turn_id=draft.turn_id,
                          status="interrupted", final=True, id=draft.message_id)  # fmt: skip

    def _end(
        self, turn_id: str, stream: TurnStream | None, state: str, code: str | None, error: str | None,
        reply: NewMessage | None, reusable: bool | None, *, actor: Actor | None = None, owner: bool = True,
    ) -> None:  # fmt: skip
        """End the turn (if it is not ended yet); ``reusable`` (None: unchanged) is whether its session may be
        resumed by the next turn. ``owner``: the turn's driver ends it (fenced by its lease), not an archive, an
        access change or a stop route ending it wherever it was accepted."""

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            now = self.clock.now_ms()
            turn = lock_turn(tx, turn_id)
            if turn.ended:
                return []
            usage = self._usage(tx, turn, stream)
            stored_reply = replace(reply, usage=public_usage(usage)) if reply is not None and usage else reply
            by = actor or (self.owner(turn) if code == "stopped" else self.actor(turn.tenant))
            ended = end_turn(tx, turn, state=state, code=code, error=error, actor=by,
                             key=self.key, now_ms=now, reply=stored_reply, usage=usage)  # fmt: skip
            if stream is not None:
                stream.ended_state = state
            if reusable is not None:
                stored = stream.stored_id if stream is not None and stream.stored_id else turn.hermes_session_id
                if stream is not None:
                    stream.bound_id = stored
                tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=turn.runner_id,
                       hermes_session_id=stored, session_reusable=int(reusable), now=now)  # fmt: skip
            return self.ended_events(ended)

        conversation_id = self._conversation_of(turn_id)
        with self.events.locked(conversation_id):
            self._write(conversation_id, write, fence=turn_id if owner else None)
            if stream is not None:
                stream.close()

    @staticmethod
    def _usage(tx: Tx, turn: ChatTurn, stream: TurnStream | None) -> dict[str, Any] | None:
        """The turn's usage from Hermes' totals at its message.complete (chat/usage.py); None without them."""
        if stream is None or stream.totals is None:
            return None
        row = tx.one("chat_turn_last_usage", conversation_id=turn.conversation_id)
        before = json.loads(row["usage"]) if row is not None else None
        resumed = stream.result is not None and stream.result.resumed
        return turn_usage(stream.totals, stream.model, resumed=resumed, before=before)

    @staticmethod
    def ended_events(ended: Ended) -> list[tuple[str, dict[str, Any]]]:
        emits: list[tuple[str, dict[str, Any]]] = []
        if ended.reply is not None:
            emits.append(("message.complete", {"turnId": ended.turn.id, "message": message_json(ended.reply)}))
        for approval in ended.expired:
            emits.append(("approval.resolved", {"turnId": ended.turn.id, "approval": approval_json(approval)}))
        emits.append((f"turn.{ended.turn.state}", {"turn": turn_json(ended.turn)}))
        if ended.promoted is not None:
            trigger = message_json(ended.promoted_trigger) if ended.promoted_trigger is not None else None
            emits.append(("turn.started", {"turn": turn_json(ended.promoted), "message": trigger}))
        return emits

    async def _finish(
        self, turn_id: str, stream: TurnStream, result: TurnResult, stopped: bool, *, recovered: bool = False
    ) -> None:
        """End the turn from Hermes' outcome, its reply under the draft's message id (``recovered``: the reply was
        read from the session's history, chat.md 5.8)."""
        if stream.closed:  # ended meanwhile (archive, access revocation)
            return
        status = result.status
        reply: NewMessage | None
        if status == "complete":
            state, code, error = "completed", None, None
            reply = NewMessage(role="assistant", author=stream.bot_id, content=result.text, turn_id=turn_id,
                               status="complete", final=True, id=stream.draft.message_id,
                               recovered=recovered)  # fmt: skip
        elif status == "error" and result.error is not None:  # an error event: no message.complete follows
            state, code, error = "failed", "hermes_error", "Hermes reported an error"
            reply = self._partial(stream)
        elif status == "error":
            state, code, error = "failed", "hermes_error", "Hermes reported an error"
            reply = NewMessage(role="assistant", author=stream.bot_id, content=result.text, turn_id=turn_id,
                               status="error", final=True, id=stream.draft.message_id)  # fmt: skip
        else:
            state, code = "interrupted", "stopped" if stopped else "hermes_interrupted"
            error = "stopped at the owner's request" if stopped else "Hermes interrupted the turn"
            reply = self._partial(stream)
        await asyncio.to_thread(self._end, turn_id, stream, state, code, error, reply, status == "complete")

    async def _end_for(self, turn_id: str, stream: TurnStream, exc: TalariaError) -> bool:
        """A stop, the turn's time limit or a revoked access ends the turn with its partial reply: whether ``exc``
        was one of those."""
        ends = {STOPPED: ("interrupted", "stopped", "stopped at the owner's request"),
                TURN_TIMEOUT: ("interrupted", TURN_TIMEOUT, exc.message),
                ACCESS_REVOKED: ("failed", ACCESS_REVOKED, exc.message)}  # fmt: skip
        if exc.code not in ends:
            return False
        state, code, error = ends[exc.code]
        await asyncio.to_thread(self._end, turn_id, stream, state, code, error, self._partial(stream), False)
        return True

    async def _end_by_code(self, turn_id: str, state: str, code: str, error: str) -> None:
        await asyncio.to_thread(self._end, turn_id, None, state, code, error, None, None)

    async def _end_uncertain(self, turn_id: str, code: str, error: str) -> None:
        await asyncio.to_thread(self._end, turn_id, None, "uncertain", code, error, None, False)
