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
reply kept, within 5 s. A hub shutting down leaves submitted turns running in Hermes; start-up (or another
replica: ``turn_leases``) recovers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

import structlog

from talaria.chat.automatic import Enqueued
from talaria.chat.records import ChatTurn, message_json, turn_json
from talaria.errors import TalariaError
from talaria.hub.chat.stream_events import Staged
from talaria.hub.turns.chat_answers import AnswerEntries
from talaria.hub.turns.chat_context import TURN_CHANNEL
from talaria.hub.turns.chat_run import RunEntries
from talaria.hub.turns.driver import ACCESS_REVOKED
from talaria.hub.turns.turn_leases import GIVE_UP_MS, LeaseLost
from talaria.lifecycle.actor import Actor
from talaria.store.interface import Row, Tx
from talaria.timeouts import within

log = structlog.get_logger("talaria.chat")


class ChatEngine(RunEntries, AnswerEntries):
    """Chat's turn engine: ``start`` once on the hub's loop; ``stop`` at shutdown."""

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop = asyncio.get_running_loop()
            self._loop_task = self._loop.create_task(self._main())
            self._renew_task = self._loop.create_task(self._renew_leases())

    async def stop(self) -> None:
        self.stopping = True  # submitted turns keep running in Hermes; start-up (or another replica) recovers them
        for loop_task in (self._loop_task, self._renew_task):
            if loop_task is not None:
                loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop_task
        self._loop_task = self._renew_task = None
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=10)
        await self.kept.close_all()
        with contextlib.suppress(TalariaError):  # else they expire: another replica takes them 30 s later
            await asyncio.to_thread(self.leases.release_all)

    def wake(self) -> None:
        """Look for turns to run now (one was accepted, a runner connected)."""
        self._wake.set()

    def stage_enqueued(self, tx: Tx, enqueued: Enqueued) -> Staged:
        """In the transaction that enqueued an automatic turn (or stored a system message, chat.md 5.10): the
        trigger's ``message.complete``, then ``turn.started`` if the turn is ``pending``; ``announce`` them after
        its commit."""
        message = message_json(enqueued.message)
        emits: list[tuple[str, dict[str, Any]]] = [
            ("message.complete", {"turnId": enqueued.message.turn_id, "message": message})
        ]
        turn = enqueued.turn
        if turn is not None and turn.state == "pending":
            emits.append(("turn.started", {"turn": turn_json(turn), "message": message}))
        return self.events.stage(tx, enqueued.conversation_id, emits)

    def announce(self, staged: Staged) -> None:
        """After the commit of ``stage_enqueued``: send its events and look for the turn to run. Any thread."""
        with self.events.locked(staged.conversation_id):
            self.events.send(staged)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.wake)

    def request_stop(self, turn_id: str) -> None:
        """The owner asked a running or recovering turn to stop (its ``stopRequested`` is stored)."""
        event = self.stops.get(turn_id)
        if event is not None:
            event.set()

    def changed(self, turn_id: str) -> None:
        """A stop or an end of the turn committed here: its driver acts on it, in this hub now, on another replica
        when ``talaria_turn`` wakes its scan (or its next scan reads the row; scale.md 4.3)."""
        self.request_stop(turn_id)
        if self.signals is not None:
            self.signals.notify(TURN_CHANNEL, turn_id)

    def end_now(self, turn_id: str, *, state: str, code: str, error: str, actor: Actor) -> None:
        """End an unended turn at once (archive, access revocation; chat.md 5.7): its partial reply kept, its
        events emitted; a running turn's Hermes session is then interrupted through its channel and the turn's
        later frames are dropped. Called from a worker thread (never inside a store transaction)."""
        stream = self.streams.get(turn_id)
        reply = self._partial(stream) if stream is not None else None
        self._end(turn_id, stream, state, code, error, reply, False, actor=actor, owner=False)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.changed, turn_id)

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
        self.kept.close_account(tenant, username)
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
        if bot_id is not None:
            self.kept.close_bot(bot_id)
        elif conversation_id is not None:
            self.kept.close_conversation(conversation_id)
        return self.end_unended(rows, state="interrupted", code="archived", error="the conversation was archived",
                                actor=actor)  # fmt: skip

    def draft(self, conversation_id: str) -> dict[str, Any] | None:
        """The live turn's streamed text not yet stored (take it under the conversation's event lock)."""
        draft = self.drafts.get(conversation_id)
        return None if draft is None else {"messageId": draft.message_id, "content": draft.text}

    async def _main(self) -> None:
        first = True
        while True:
            try:
                await self.scan(recover=first)
                first = False
                self.scans += 1
            except Exception:  # a bad scan must not end the engine
                log.exception("chat_scan_failed")
            with contextlib.suppress(TimeoutError):
                await within(self._wake.wait(), self.timings.dispatcher_scan_s)
            self._wake.clear()

    async def scan(self, *, recover: bool = False) -> None:
        """Start every pending turn not yet started, and recover the running and recovering turns left by a
        restart (``recover``: the first scan after start-up) or by a replica no longer live; only a turn whose lease
        this hub takes (scale.md 4.3). A stop or an end stored by another replica reaches the turns driven here."""
        rows, elsewhere = await asyncio.to_thread(self._unended)
        self._follow(rows)
        for turn in rows:
            if turn.id in self.running or turn.id in elsewhere or turn.state == "queued":
                continue
            pending = turn.state == "pending"
            token = await asyncio.to_thread(self.leases.take, turn.id, unstarted=pending, first_scan=recover)
            if token is None:
                continue
            self.tokens[turn.id] = token
            self._launch(turn.id, self._run(turn.id) if pending else self._recover(turn.id))

    def _unended(self) -> tuple[list[ChatTurn], set[str]]:
        with self.store.read() as tx:
            rows = [ChatTurn.from_row(row) for row in tx.all("chat_turn_unended")]
        return rows, self.leases.elsewhere()

    def _follow(self, rows: list[ChatTurn]) -> None:
        """Turns driven here that another replica stopped or ended (archive, an access change): their stop event."""
        unended = {turn.id: turn for turn in rows}
        for turn_id in list(self.running):
            turn = unended.get(turn_id)
            if turn is None:  # ended elsewhere: later frames are dropped, the session interrupted
                stream = self.streams.get(turn_id)
                if stream is not None and (stream.closed or stream.ended_state is not None):
                    continue  # its own end, stored here
                if stream is not None:
                    stream.close()
                self.request_stop(turn_id)
            elif turn.stop_requested:
                self.request_stop(turn_id)

    def _launch(self, turn_id: str, work: Coroutine[Any, Any, None]) -> None:
        self.stops[turn_id] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._driven(turn_id, work))
        self.running[turn_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(turn_id, None)
            self.stops.pop(turn_id, None)
            self.tokens.pop(turn_id, None)
            self.lost.discard(turn_id)
            self.wake()

        task.add_done_callback(done)

    async def _driven(self, turn_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Drive one turn under its lease, then give the lease back (not after a cancel: a stopping hub releases
        every lease at once, and a lost one is another replica's)."""
        try:
            await work
        except LeaseLost:
            log.warning("chat_turn_lease_lost", turn=turn_id)
            return
        token = self.tokens.get(turn_id)
        if token is not None and turn_id not in self.lost:
            with contextlib.suppress(TalariaError):  # else it expires
                await asyncio.to_thread(self.leases.release, turn_id, token)

    async def _renew_leases(self) -> None:
        """Every ``renew_s``: renew the leases of the turns driven here. A turn whose lease another replica took,
        or every turn after 20 s without a renewal, is no longer driven here: its task is cancelled without a
        write or an interrupt (its new owner recovers it)."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.leases.renew_s)
            held = dict(self.tokens)
            lost = await asyncio.to_thread(self.leases.renew, held)
            if lost is None:
                if (time.monotonic() - renewed) * 1000 < GIVE_UP_MS:
                    continue
                lost = set(held)
            else:
                renewed = time.monotonic()
            for turn_id in lost:
                log.warning("chat_turn_lease_lost", turn=turn_id)
                self.lost.add(turn_id)
                task = self.running.get(turn_id)
                if task is not None:
                    task.cancel()
