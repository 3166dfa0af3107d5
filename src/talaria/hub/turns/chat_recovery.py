"""Recovery of a chat turn without replay (chat.md 5.8, hermes.md 11): a turn whose channel was lost after its
submit record, or that was running when the hub stopped, becomes ``recovering``; on its own runner, once that is
back (within ``chat.recovery_wait_s``) and the account still has access, the stored session's history decides:
a reply after the marker completes the turn (``recovered: true``), anything else ends it ``uncertain``. Another
runner serving the source now ends it ``uncertain`` ``runner_target_changed`` at once. Nothing is submitted again.
A stop ends it ``interrupted`` ``stopped`` (chat.md 5.6), the session interrupted through a cleanup-only channel;
when another runner serves the source by then, the stop is 409 ``runner_target_changed`` and the turn ends
``uncertain`` so (``stop_recovering``).

On PostgreSQL replicas a turn whose owner died or stopped with its channel still open is adopted first (scale.md
4.4, chat turns alike): under the turn's lease the new owner takes the channel over (owner counter + 1), goes on
from the stored draft and frame cursor, and handles the frames after the cursor as the owner would have, so the
stream goes on without a gap; a turn no longer running with no end among its frames is completed from the history.
Only when the channel cannot be adopted is the session resumed on a new one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import structlog

from talaria.chat.records import ChatTurn
from talaria.chat.turn_writes import NewMessage, get_turn, lock_turn, next_state, set_turn
from talaria.errors import TalariaError
from talaria.hub.dispatch import turn_recovery
from talaria.hub.dispatch.job_turns import JobTurn
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.turns.chat_context import UNCERTAIN, ChatContext
from talaria.hub.turns.chat_frames import TurnStream
from talaria.hub.turns.driver import ACCESS_REVOKED, TurnResult
from talaria.hub.turns.turn_leases import LeaseLost
from talaria.store.interface import Row, Tx
from talaria.timeouts import within

log = structlog.get_logger("talaria.chat")

# An adopted turn's session found idle ended meanwhile: its end frame may still be on its way (the runner posts frames
# and command results on separate requests). Wait this long for it before the history decides.
END_FRAMES_WAIT_S = 5.0


def _reason(exc: Exception) -> str:
    """Why a recovery gave up, for the log: a refusal's code or ``Unrecoverable``'s case (never its message, which
    may quote Hermes)."""
    if isinstance(exc, TalariaError):
        return exc.code
    return exc.case if isinstance(exc, turn_recovery.Unrecoverable) else type(exc).__name__


class RecoveryEntries(ChatContext):
    def stop_recovering(self, turn: ChatTurn) -> None:
        """The stop route's check for a ``recovering`` turn (chat.md 5.6): if another runner serves its source now,
        the turn ends ``uncertain`` ``runner_target_changed`` and the stop is refused with that code. Worker thread."""
        if turn.state != "recovering":
            return
        runner = self._place(turn).runner
        if runner is not None and runner.enabled and runner.id != turn.runner_id:
            self._end(turn.id, None, "uncertain", "runner_target_changed", "another execution node serves the bot now",
                      None, False, owner=False)  # fmt: skip
            raise TalariaError("runner_target_changed", "another execution node serves this bot now; the turn ended "
                               "uncertain")  # fmt: skip

    def _lose(self, turn_id: str) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            turn = lock_turn(tx, turn_id)
            if turn.state != "running":
                return []
            set_turn(tx, turn, self.clock.now_ms(), state=next_state("running", "lose"))
            tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=turn.runner_id,
                   hermes_session_id=turn.hermes_session_id, session_reusable=0, now=self.clock.now_ms())  # fmt: skip
            return [("turn.recovering", {"turnId": turn_id})]

        self._write(self._conversation_of(turn_id), write, fence=turn_id)

    async def _end_stopped(self, turn_id: str) -> None:
        await asyncio.to_thread(self._end, turn_id, None, "interrupted", "stopped", "stopped at the owner's request",
                                None, False)  # fmt: skip

    async def _recover(self, turn_id: str) -> None:
        """Wait for the turn's own runner, then complete it from the session's history or end it ``uncertain``;
        nothing is ever submitted again. A stop (chat.md 5.6) ends it ``interrupted`` ``stopped`` at once, after a
        cleanup-only channel interrupted the session if its runner is connected."""
        stop = self.stops.get(turn_id) or asyncio.Event()
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
            if stop.is_set():  # its node is away: nothing to interrupt now, and the session is never reused
                await self._end_stopped(turn_id)
                return
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), self.timings.runner_back_check_s)
        record = JobTurn(job_id=turn.id, tenant=turn.tenant, attempt=1, runner_id=turn.runner_id,
                         profile=place.conversation["bot_profile"], stored_session_id=turn.hermes_session_id,
                         marker=turn.marker or "", state="submitted", connection_id=turn.connection_id,
                         first_seq=turn.first_seq, runtime_id=turn.runtime_session_id)  # fmt: skip
        account = AccountRef(turn.owner, turn.tenant, turn.auth_version)
        if not await asyncio.to_thread(self._still_allowed, turn, place.conversation):
            await self._end_by_code(turn_id, "failed", ACCESS_REVOKED, "the account lost access to this bot")
            await turn_recovery.interrupt_for_cleanup(self.driver.channels, record, account)
            return
        deadline = (turn.submitted_at or turn.created_at) + self.settings.chat_turn_max_s * 1000
        if await self._adopted(turn, place.conversation, record, account, stop, deadline):
            return
        recovering = asyncio.ensure_future(
            turn_recovery.recover(self.driver.channels, account, record, clock=self.clock, deadline_ms=deadline)
        )
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({recovering, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the hub stops, or another replica drives the turn now
            recovering.cancel()
            raise
        finally:
            stopping.cancel()
        if not recovering.done():  # chat.md 5.6: stopped while recovering: a cleanup-only channel interrupts it
            recovering.cancel()
            with contextlib.suppress(asyncio.CancelledError, TalariaError, turn_recovery.Unrecoverable):
                await recovering
            with contextlib.suppress(TimeoutError):
                await within(turn_recovery.interrupt_for_cleanup(self.driver.channels, record, account), 3)
            await self._end_stopped(turn_id)
            return
        try:
            result = recovering.result()
        except (turn_recovery.Unrecoverable, TalariaError) as exc:
            log.info("chat_turn_unrecoverable", turn=turn_id, reason=_reason(exc))
            await self._end_uncertain(turn_id, UNCERTAIN, "the turn may have run; its reply could not be found")
            return
        reply = NewMessage(role="assistant", author=place.conversation["bot_id"], content=result.text,
                           turn_id=turn_id, status="complete", final=True, recovered=True)  # fmt: skip
        await asyncio.to_thread(self._end, turn_id, None, "completed", None, None, reply, True)

    async def _adopted(
        self, turn: ChatTurn, conversation: Row, record: JobTurn, account: AccountRef, stop: asyncio.Event,
        deadline: int,
    ) -> bool:  # fmt: skip
        """Go on with the turn through its own channel, adopted from its previous owner (module docstring): True
        once the turn ended so, False when there is no channel to adopt or it failed before an end (the caller
        resumes the session on a new channel)."""
        token = self.tokens.get(turn.id)
        held = self.leases.holding(turn.id, token) if token is not None else None
        channels = self.driver.channels
        gateway = await turn_recovery.adopt(channels, account, record, held)
        if gateway is None:
            return False
        log.info("chat_turn_channel_adopted", turn=turn.id, connection=gateway.id, counter=gateway.owner_counter)
        stream = TurnStream(self.store, self.clock, self.events, turn.conversation_id, turn.id, conversation["bot_id"],
                            self.drafts, self.fence)  # fmt: skip
        await asyncio.to_thread(self._go_on_from_owner, stream, turn.id)
        result = TurnResult("", "", str(record.runtime_id), record.stored_session_id, record.marker, resumed=True,
                            gateway=gateway)  # fmt: skip
        stream.result = result
        self.streams[turn.id] = stream
        leave = False  # the hub stops or another replica drives the turn now: the channel stays for its next owner
        try:
            collect = functools.partial(self.driver.collect, gateway, result, None, deadline_ms=deadline,
                                        on_frame=stream.on_frame, stop=stop)  # fmt: skip
            await collect(through=gateway.replay_to)  # what reached the store while nobody owned the turn
            if not result.status and await turn_recovery.still_running(channels, gateway, record):
                await collect()
            elif not result.status:  # it ended: its last frames may still be on their way from the runner
                with contextlib.suppress(TimeoutError):
                    await within(collect(), END_FRAMES_WAIT_S)
            recovered = not result.status
            log.info("chat_turn_adopted_end", turn=turn.id, status=result.status or "none", from_history=recovered)
            if recovered:
                stored = str(record.stored_session_id)
                result.status, result.text = "complete", await turn_recovery.from_history(channels, account, record,
                                                                                          stored)  # fmt: skip
            await self._finish(turn.id, stream, result, stop.is_set(), recovered=recovered)  # before the close
            return True
        except turn_recovery.Unrecoverable as exc:
            log.info("chat_turn_unrecoverable", turn=turn.id, reason=_reason(exc))
            stream.close()
            await self._end_uncertain(turn.id, UNCERTAIN, "the turn may have run; its reply could not be found")
            return True
        except TalariaError as exc:
            if await self._end_for(turn.id, stream, exc):
                return True
            log.info("chat_turn_adoption_failed", turn=turn.id, code=exc.code)
            stream.close()
            return False
        except (asyncio.CancelledError, LeaseLost):
            leave = True
            raise
        finally:
            self.streams.pop(turn.id, None)
            if not leave:
                with contextlib.suppress(TalariaError):
                    await channels.close_gateway(gateway)

    def _go_on_from_owner(self, stream: TurnStream, turn_id: str) -> None:
        """``stream`` goes on from what the turn's previous owner stored (``TurnStream.adopt``)."""
        with self.store.read() as tx:
            turn = get_turn(tx, turn_id)
            stream.adopt(tx, turn.frame_seq)
