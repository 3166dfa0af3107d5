"""Chat turns on the turn engine (chat.md 5): the hub takes each ``pending`` turn to its bot's execution node.

Steps (chat.md 5.3): the source's enabled runner (another than the conversation's: a node switch); wait while it
is offline or runs ``chat.per_runner`` chat turns (``turn.waiting`` once per reason; ``failed`` ``runner_offline``
after ``chat.pending_wait_s``); access checked again (``failed`` ``access_revoked``); a gateway channel; the stored
session resumed when it may be, else a new one with its carry-over; the submit record (turn ``running``, marker,
binding) before ``prompt.submit``; Hermes' frames streamed (``chat_frames``); the end stored with its reply and
``chat.turn.ended``. Before the submit record a failure ends the turn ``failed`` with its code; from it on the
prompt is never submitted again: a lost channel or a hub restart makes the turn ``recovering``, and only the
session's history can complete it (``recovered: true``), else it ends ``uncertain``.

Stop (5.6) sets the turn's stop event: ``session.interrupt``, and ``interrupted`` ``stopped`` with the partial
reply kept, within 5 s. A hub shutting down leaves submitted turns running in Hermes; start-up recovers them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import structlog

from talaria.accounts.service import Accounts
from talaria.chat import prompt as prompts
from talaria.chat.bots import Allowed
from talaria.chat.records import ChatTurn, message_json, turn_json
from talaria.chat.turn_writes import Ended, NewMessage, end_turn, get_turn, next_state, set_turn, store_message
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.chat.events import ChatEvents
from talaria.hub.dispatch import turn_recovery
from talaria.hub.dispatch.job_turns import JobTurn
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.connections import RunnerHub
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.timings import HubTimings
from talaria.hub.turns.chat_frames import Draft, TurnStream
from talaria.hub.turns.driver import ACCESS_REVOKED, STOPPED, TURN_TIMEOUT, TurnDriver, TurnHooks, TurnResult
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.settings import Settings
from talaria.store.interface import Row, Store, Tx

log = structlog.get_logger("talaria.chat")

UNCERTAIN = "runner_command_uncertain"


@dataclass(frozen=True)
class Place:
    """Where a turn runs: its conversation's row (with the bot) and the source's runner now."""

    conversation: Row
    runner: RunnerRecord | None


class ChatEngine:
    def __init__(
        self, *, store: Store, clock: Clock, settings: Settings, key: AuditKey, accounts: Accounts,
        allowed: Allowed, registry: RunnerRegistry, runners: RunnerHub, driver: TurnDriver, events: ChatEvents,
        timings: HubTimings,
    ) -> None:  # fmt: skip
        self.store, self.clock, self.settings, self.key = store, clock, settings, key
        self.accounts, self.allowed, self.registry, self.runners = accounts, allowed, registry, runners
        self.driver, self.events, self.timings = driver, events, timings
        self.drafts: dict[str, Draft] = {}
        self.running: dict[str, asyncio.Task[None]] = {}
        self.stops: dict[str, asyncio.Event] = {}
        self.per_runner: dict[str, int] = {}
        self.streams: dict[str, TurnStream] = {}
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop = asyncio.get_running_loop()
            self._loop_task = self._loop.create_task(self._main())

    async def stop(self) -> None:
        self.stopping = True  # submitted turns keep running in Hermes; start-up recovers them
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=10)

    def wake(self) -> None:
        """Look for turns to run now (one was accepted, a runner connected)."""
        self._wake.set()

    def request_stop(self, turn_id: str) -> None:
        """The owner asked a running or recovering turn to stop (its ``stopRequested`` is stored)."""
        event = self.stops.get(turn_id)
        if event is not None:
            event.set()

    def end_now(self, turn_id: str, *, state: str, code: str, error: str, actor: Actor) -> None:
        """End an unended turn at once (archive, access revocation; chat.md 5.7): its partial reply kept, its
        events emitted; a running turn's Hermes session is then interrupted through its channel and the turn's
        later frames are dropped. Called from a worker thread (never inside a store transaction)."""
        stream = self.streams.get(turn_id)
        reply = self._partial(stream) if stream is not None else None
        self._end(turn_id, stream, state, code, error, reply, False, actor=actor)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.request_stop, turn_id)

    def end_unended(self, rows: list[Row], *, state: str, code: str, error: str, actor: Actor) -> int:
        """``end_now`` for each turn of ``rows`` not ended yet; how many there were."""
        turns = [ChatTurn.from_row(row) for row in rows]
        for turn in turns:
            self.end_now(turn.id, state=state, code=code, error=error, actor=actor)
        return len(turns)

    def revoke(self, tenant: str, username: str, actor: Actor) -> int:
        """An account's access changed (its ``auth_version`` or enabled flag, chat.md 5.7): every unended turn
        accepted under another version, or of a disabled account, ends ``failed`` ``access_revoked``."""
        account = self.accounts.get(username)
        with self.store.read() as tx:
            rows = tx.all("chat_turn_unended_owner", tenant=tenant, owner=username)
        stale = [r for r in rows if account is None or not account.enabled or r["auth_version"] != account.auth_version]
        return self.end_unended(stale, state="failed", code=ACCESS_REVOKED,
                                error="the account's access changed; the turn was stopped", actor=actor)  # fmt: skip

    def archive(self, actor: Actor, *, conversation_id: str | None = None, bot_id: str | None = None) -> int:
        """A conversation or a bot archived: the unended turns of that conversation, or of each of the bot's,
        end ``interrupted`` ``archived``; no other turn is touched."""
        with self.store.read() as tx:
            if bot_id is not None:
                rows = tx.all("chat_turn_unended_bot", bot_id=bot_id)
            else:
                rows = tx.all("chat_turn_unended_conversation", conversation_id=conversation_id)
        return self.end_unended(rows, state="interrupted", code="archived", error="the conversation was archived",
                                actor=actor)  # fmt: skip

    def draft(self, conversation_id: str) -> dict[str, Any] | None:
        """The live turn's streamed text not yet stored (take it under the conversation's event lock)."""
        draft = self.drafts.get(conversation_id)
        return None if draft is None else {"messageId": draft.message_id, "content": draft.text}

    def actor(self, tenant: str) -> Actor:
        return Actor(self.settings.lifecycle_dispatcher_principal, frozenset(), "in_process", tenant)

    async def _main(self) -> None:
        first = True
        while True:
            try:
                await self.scan(recover=first)
                first = False
            except Exception:  # a bad scan must not end the engine
                log.exception("chat_scan_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timings.dispatcher_scan_s)
            self._wake.clear()

    async def scan(self, *, recover: bool = False) -> None:
        """Start every pending turn not yet started; ``recover`` (the first scan after start-up): running turns
        become ``recovering``, and recovering ones are recovered."""
        rows = await asyncio.to_thread(self._unended)
        for turn in rows:
            if turn.id in self.running:
                continue
            if turn.state == "pending":
                self._launch(turn.id, self._run(turn.id))
            elif recover and turn.state in ("running", "recovering"):
                self._launch(turn.id, self._recover(turn.id))

    def _unended(self) -> list[ChatTurn]:
        with self.store.read() as tx:
            return [ChatTurn.from_row(row) for row in tx.all("chat_turn_unended")]

    def _launch(self, turn_id: str, work: Any) -> None:
        self.stops[turn_id] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(work)
        self.running[turn_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(turn_id, None)
            self.stops.pop(turn_id, None)
            self.wake()

        task.add_done_callback(done)

    # --- one turn ------------------------------------------------------------------------------------------------

    async def _run(self, turn_id: str) -> None:
        try:
            await self._run_turn(turn_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("chat_turn_failed", turn=turn_id)
            with contextlib.suppress(Exception):
                await self._end_by_code(turn_id, "failed", "internal_error", "the hub failed to run this turn")

    async def _run_turn(self, turn_id: str) -> None:
        turn = await asyncio.to_thread(self._turn, turn_id)
        stop = self.stops[turn_id]
        place = await self._wait_for_runner(turn, stop)
        if place is None:
            return
        assert place.runner is not None
        runner = place.runner
        conversation = place.conversation
        if not await asyncio.to_thread(self._still_allowed, turn, conversation):
            await self._end_by_code(turn.id, "failed", ACCESS_REVOKED, "the account lost access to this bot")
            return
        bound = conversation["runner_id"]
        node_changed = bound is not None and bound != runner.id
        resume_id = None
        if not node_changed and bound == runner.id and conversation["session_reusable"]:
            resume_id = conversation["hermes_session_id"]
        stream = TurnStream(self.store, self.clock, self.events, conversation["id"], turn.id,
                            conversation["bot_id"], self.drafts)  # fmt: skip
        self.streams[turn.id] = stream
        carry = prompts.NONE

        async def prompt_for(result: TurnResult) -> str:
            nonlocal carry
            if node_changed:
                carry = prompts.NODE_CHANGED
            elif not result.resumed and conversation["hermes_session_id"] is not None:
                carry = prompts.SESSION_RESTORED if result.resume_refused else prompts.SESSION_REPLACED
            return await asyncio.to_thread(self._prompt, turn, conversation, carry, not result.resumed)

        async def before_submit(result: TurnResult) -> None:
            await asyncio.to_thread(self._submit_record, turn.id, runner, result, carry, node_changed)

        async def after_submit(result: TurnResult) -> None:
            await asyncio.to_thread(self._submitted, turn.id)

        self.per_runner[runner.id] = self.per_runner.get(runner.id, 0) + 1
        try:
            result = await self.driver.run(
                runner_id=runner.id, account=AccountRef(turn.owner, turn.tenant, turn.auth_version),
                profile=conversation["bot_profile"], work_id=conversation["id"], prompt="", tools=False,
                deadline_ms=self.clock.now_ms() + self.settings.chat_turn_max_s * 1000,
                hooks=TurnHooks(before_submit, after_submit, interrupt_abandoned=lambda: not self.stopping),
                resume_id=resume_id, marker=f"[talaria-run:{turn.id}:{turn.trigger_message_id}]",
                on_frame=stream.on_frame, stop=stop, prompt_for=prompt_for,
            )  # fmt: skip
        except TalariaError as exc:
            await self._after_error(turn.id, stream, exc)
            return
        finally:
            self.per_runner[runner.id] -= 1
            self.streams.pop(turn.id, None)
        await self._finish(turn.id, stream, result, stop.is_set())

    def _turn(self, turn_id: str) -> ChatTurn:
        with self.store.read() as tx:
            return get_turn(tx, turn_id)

    def _place(self, turn: ChatTurn) -> Place:
        with self.store.read() as tx:
            row = tx.one("chat_conversation_by_id", id=turn.conversation_id)
        assert row is not None
        return Place(row, self.registry.for_source(turn.tenant, row["bot_source"]))

    async def _wait_for_runner(self, turn: ChatTurn, stop: asyncio.Event) -> Place | None:
        """The place to run ``turn`` once its runner is connected and has room; None if the turn ended meanwhile
        (stopped, or ``runner_offline`` after ``chat.pending_wait_s``)."""
        give_up = turn.created_at + self.settings.chat_pending_wait_s * 1000
        reason: str | None = None
        while True:
            place = await asyncio.to_thread(self._place, turn)
            runner = place.runner
            if runner is not None and runner.enabled and self.runners.is_connected(runner.id):
                if self.per_runner.get(runner.id, 0) < self.settings.chat_per_runner:
                    return place
                now_reason = f"waiting for node {runner.name}: busy"
            else:
                name = runner.name if runner is not None else place.conversation["bot_source"]
                now_reason = f"waiting for node {name} to connect"
            if now_reason != reason:
                reason = now_reason
                await asyncio.to_thread(self._waiting, turn.id, reason)
            if self.clock.now_ms() >= give_up:
                await self._end_by_code(turn.id, "failed", "runner_offline",
                                        "the execution node did not connect in time; nothing was sent")  # fmt: skip
                return None
            if stop.is_set():
                return None  # the stop route ended the pending turn itself
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.timings.runner_back_check_s)

    def _still_allowed(self, turn: ChatTurn, conversation: Row) -> bool:
        account = self.accounts.get(turn.owner)
        if account is None or not account.enabled or account.auth_version != turn.auth_version:
            return False
        return self.allowed(account, conversation["bot_source"], conversation["bot_profile"])

    def _waiting(self, turn_id: str, reason: str) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            turn = get_turn(tx, turn_id)
            if turn.state != "pending":
                return []
            set_turn(tx, turn, self.clock.now_ms(), waiting_reason=reason)
            return [("turn.waiting", {"turnId": turn_id, "waitingReason": reason})]

        self._write(self._conversation_of(turn_id), write)

    def _conversation_of(self, turn_id: str) -> str:
        return self._turn(turn_id).conversation_id

    def _write(self, conversation_id: str, write: Any) -> Any:
        """Commit ``write(tx)``, then emit the events it returns, under the conversation's event lock."""
        with self.events.locked(conversation_id):
            with self.store.write() as tx:
                emits = write(tx)
            for kind, data in emits:
                self.events.emit(conversation_id, kind, data)

    def _prompt(self, turn: ChatTurn, conversation: Row, carry: str, new_session: bool) -> str:
        with self.store.read() as tx:
            trigger = tx.one("chat_message_get", conversation_id=conversation["id"], id=turn.trigger_message_id)
            earlier: list[prompts.Earlier] = []
            if carry != prompts.NONE:
                rows = tx.all("chat_message_transcript", conversation_id=conversation["id"],
                              limit=prompts.CARRY_MESSAGES + 1)  # fmt: skip
                earlier = [prompts.Earlier(r["role"], r["content"]) for r in rows if r["id"] != turn.trigger_message_id]
        assert trigger is not None
        text = turn.prompt if turn.trigger == "automatic" and turn.prompt else trigger["content"]
        return prompts.prompt_text(
            text=text, instructions=conversation["bot_instructions"], new_session=new_session, carry=carry,
            earlier=earlier,
        )  # fmt: skip

    def _submit_record(
        self, turn_id: str, runner: RunnerRecord, result: TurnResult, carry: str, node_changed: bool
    ) -> None:
        """Chat.md 5.3 step 8, one transaction: if it fails, nothing is submitted."""

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            now = self.clock.now_ms()
            turn = get_turn(tx, turn_id)
            if turn.state != "pending" or turn.stop_requested:
                raise TalariaError("turn_finished", "the turn ended before it was submitted")
            set_turn(
                tx, turn, now, state=next_state("pending", "submit"), submit_state="submitting", runner_id=runner.id,
                hermes_session_id=result.stored_id, marker=result.marker, carry=carry, submitted_at=now,
                waiting_reason=None,
            )  # fmt: skip
            tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=runner.id,
                   hermes_session_id=result.stored_id, session_reusable=0, now=now)  # fmt: skip
            if not node_changed:
                return []
            text = prompts.NODE_SWITCH_MESSAGE.format(name=runner.name)
            notice = store_message(
                tx,
                turn.conversation_id,
                NewMessage(role="system", author="talaria", content=text, turn_id=turn.id),
                now,
            )
            return [("message.complete", {"turnId": turn.id, "message": message_json(notice)})]

        self._write(self._conversation_of(turn_id), write)

    def _submitted(self, turn_id: str) -> None:
        with self.store.write() as tx:
            turn = get_turn(tx, turn_id)
            if turn.submit_state == "submitting":
                set_turn(tx, turn, self.clock.now_ms(), submit_state="submitted")

    # --- ends ----------------------------------------------------------------------------------------------------

    async def _finish(self, turn_id: str, stream: TurnStream, result: TurnResult, stopped: bool) -> None:
        if stream.closed:  # ended meanwhile (archive, access revocation)
            return
        status = result.status
        reply: NewMessage | None
        if status == "complete":
            state, code, error = "completed", None, None
            reply = NewMessage(role="assistant", author=stream.bot_id, content=result.text, turn_id=turn_id,
                               status="complete", final=True, id=stream.draft.message_id)  # fmt: skip
        elif status == "error":
            state, code, error = "failed", "hermes_error", "Hermes reported an error"
            reply = NewMessage(role="assistant", author=stream.bot_id, content=result.text, turn_id=turn_id,
                               status="error", final=True, id=stream.draft.message_id)  # fmt: skip
        else:
            state, code = "interrupted", "stopped" if stopped else "hermes_interrupted"
            error = "stopped at the owner's request" if stopped else "Hermes interrupted the turn"
            reply = self._partial(stream)
        await asyncio.to_thread(self._end, turn_id, stream, state, code, error, reply, status == "complete")

    async def _after_error(self, turn_id: str, stream: TurnStream, exc: TalariaError) -> None:
        turn = await asyncio.to_thread(self._turn, turn_id)
        if turn.ended:
            stream.close()
            return
        if exc.code == STOPPED:
            await asyncio.to_thread(self._end, turn_id, stream, "interrupted", "stopped",
                                    "stopped at the owner's request", self._partial(stream), False)  # fmt: skip
        elif exc.code == TURN_TIMEOUT:
            await asyncio.to_thread(self._end, turn_id, stream, "interrupted", TURN_TIMEOUT, exc.message,
                                    self._partial(stream), False)  # fmt: skip
        elif exc.code == ACCESS_REVOKED:
            await asyncio.to_thread(self._end, turn_id, stream, "failed", ACCESS_REVOKED, exc.message,
                                    self._partial(stream), False)  # fmt: skip
        elif turn.submit_state == "none":
            await asyncio.to_thread(self._end, turn_id, stream, "failed", exc.code, exc.message, None, None)
        elif exc.code == "turn_finished":
            stream.close()
        else:  # submitted, or maybe: never submit again; only the history can tell
            stream.close()
            await asyncio.to_thread(self._lose, turn_id)
            await self._recover(turn_id)

    def _partial(self, stream: TurnStream) -> NewMessage | None:
        draft = stream.draft
        if not draft.text:
            return None
        return NewMessage(role="assistant", author=stream.bot_id, content=draft.text, turn_id=draft.turn_id,
                          status="interrupted", final=True, id=draft.message_id)  # fmt: skip

    def _end(
        self, turn_id: str, stream: TurnStream | None, state: str, code: str | None, error: str | None,
        reply: NewMessage | None, reusable: bool | None, *, actor: Actor | None = None,
    ) -> None:  # fmt: skip
        """End the turn (if it is not ended yet); ``reusable`` (None: unchanged) is whether its session may be
        resumed by the next turn."""

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            now = self.clock.now_ms()
            turn = get_turn(tx, turn_id)
            if turn.ended:
                return []
            ended = end_turn(tx, turn, state=state, code=code, error=error, actor=actor or self.actor(turn.tenant),
                             key=self.key, now_ms=now,
                             reply=reply, usage=stream.usage if stream is not None else None)  # fmt: skip
            if reusable is not None:
                stored = stream.stored_id if stream is not None and stream.stored_id else turn.hermes_session_id
                tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=turn.runner_id,
                       hermes_session_id=stored, session_reusable=int(reusable), now=now)  # fmt: skip
            return self.ended_events(ended)

        with self.events.locked(self._conversation_of(turn_id)):
            self._write(self._conversation_of(turn_id), write)
            if stream is not None:
                stream.close()

    @staticmethod
    def ended_events(ended: Ended) -> list[tuple[str, dict[str, Any]]]:
        emits: list[tuple[str, dict[str, Any]]] = []
        if ended.reply is not None:
            emits.append(("message.complete", {"turnId": ended.turn.id, "message": message_json(ended.reply)}))
        emits.append((f"turn.{ended.turn.state}", {"turn": turn_json(ended.turn)}))
        if ended.promoted is not None:
            emits.append(("turn.started", {"turn": turn_json(ended.promoted), "message": None}))
        return emits

    async def _end_by_code(self, turn_id: str, state: str, code: str, error: str) -> None:
        await asyncio.to_thread(self._end, turn_id, None, state, code, error, None, None)

    # --- recovery (chat.md 5.8) ----------------------------------------------------------------------------------

    def _lose(self, turn_id: str) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            turn = get_turn(tx, turn_id)
            if turn.state != "running":
                return []
            set_turn(tx, turn, self.clock.now_ms(), state=next_state("running", "lose"))
            tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=turn.runner_id,
                   hermes_session_id=turn.hermes_session_id, session_reusable=0, now=self.clock.now_ms())  # fmt: skip
            return [("turn.recovering", {"turnId": turn_id})]

        self._write(self._conversation_of(turn_id), write)

    async def _recover(self, turn_id: str) -> None:
        """Wait for the turn's own runner, then complete it from the session's history or end it ``uncertain``;
        nothing is ever submitted again."""
        await asyncio.to_thread(self._lose, turn_id)
        turn = await asyncio.to_thread(self._turn, turn_id)
        if turn.state != "recovering" or turn.runner_id is None:
            return
        give_up = self.clock.now_ms() + self.settings.chat_recovery_wait_s * 1000
        while True:
            place = await asyncio.to_thread(self._place, turn)
            if place.runner is None or not place.runner.enabled:
                await self._end_uncertain(turn_id, UNCERTAIN, "the execution node of this turn is gone")
                return
            if place.runner.id != turn.runner_id:
                await self._end_uncertain(turn_id, "runner_target_changed", "another execution node serves the bot now")
                return
            if self.runners.is_connected(turn.runner_id):
                break
            if self.clock.now_ms() >= give_up:
                await self._end_uncertain(turn_id, UNCERTAIN, "the execution node did not come back in time")
                return
            await asyncio.sleep(self.timings.runner_back_check_s)
        if not await asyncio.to_thread(self._still_allowed, turn, place.conversation):
            await self._end_by_code(turn_id, "failed", ACCESS_REVOKED, "the account lost access to this bot")
            return
        record = JobTurn(job_id=turn.id, tenant=turn.tenant, attempt=1, runner_id=turn.runner_id,
                         profile=place.conversation["bot_profile"], stored_session_id=turn.hermes_session_id,
                         marker=turn.marker or "", state="submitted")  # fmt: skip
        account = AccountRef(turn.owner, turn.tenant, turn.auth_version)
        deadline = (turn.submitted_at or turn.created_at) + self.settings.chat_turn_max_s * 1000
        try:
            result = await turn_recovery.recover(self.driver.channels, account, record, clock=self.clock,
                                                 deadline_ms=deadline)  # fmt: skip
        except (turn_recovery.Unrecoverable, TalariaError) as exc:
            log.info("chat_turn_unrecoverable", turn=turn_id, reason=type(exc).__name__)
            await self._end_uncertain(turn_id, UNCERTAIN, "the turn may have run; its reply could not be found")
            return
        reply = NewMessage(role="assistant", author=place.conversation["bot_id"], content=result.text,
                           turn_id=turn_id, status="complete", final=True, recovered=True)  # fmt: skip
        await asyncio.to_thread(self._end, turn_id, None, "completed", None, None, reply, True)

    async def _end_uncertain(self, turn_id: str, code: str, error: str) -> None:
        await asyncio.to_thread(self._end, turn_id, None, "uncertain", code, error, None, False)
