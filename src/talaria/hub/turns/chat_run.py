"""One chat turn taken to its node (chat.md 5.3): the source's enabled runner (another than the conversation's: a
node switch); waiting while it is offline or busy (``turn.waiting`` once per reason; ``failed`` ``runner_offline``
after ``chat.pending_wait_s``); access checked again; the stored session resumed when it may be, else a new one
with its carry-over and the bot's instructions; the submit record before ``prompt.submit``; Hermes' frames
streamed; the end stored. Before the submit record a failure ends the turn ``failed`` with its code; from it on
the prompt is never submitted again (a lost channel: recovery)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Final

import structlog

from talaria.chat import prompt as prompts
from talaria.chat.attachments import of_messages
from talaria.chat.records import ChatTurn, message_json
from talaria.chat.turn_writes import NewMessage, get_turn, lock_turn, next_state, set_turn, store_message
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.registry import RunnerRecord
from talaria.hub.turns import team_round
from talaria.hub.turns.chat_attach import send_attachments
from talaria.hub.turns.chat_channels import Kept
from talaria.hub.turns.chat_context import Place
from talaria.hub.turns.chat_frames import TurnStream
from talaria.hub.turns.chat_recovery import RecoveryEntries
from talaria.hub.turns.driver import ACCESS_REVOKED, LiveChannel, TurnHooks, TurnResult
from talaria.hub.turns.team_round import RoundTools
from talaria.hub.turns.turn_leases import LeaseLost
from talaria.store.interface import Row, Tx
from talaria.timeouts import within

log = structlog.get_logger("talaria.chat")

# Before the submit record these send the turn back to step 2 (wait for the runner) instead of ending it (chat.md
# 5.3): the runner took nothing, or its connection went away, so nothing can have reached the model.
WAIT_AGAIN = frozenset({"runner_offline", "runner_connection_closed", "runner_draining"})


TEAM_TOOLS_UNAVAILABLE: Final = "Team tools are not available on this node; this turn runs without them."


@dataclass(frozen=True)
class TeamTools:
    """A turn's team tools (chat.md 5.9): whether it is entitled to the catalog, and whether it got it."""

    entitled: bool
    offered: bool


class RunEntries(RecoveryEntries):
    async def _run(self, turn_id: str) -> None:
        try:
            await self._run_turn(turn_id)
        except (asyncio.CancelledError, LeaseLost):
            raise
        except Exception:
            log.exception("chat_turn_failed", turn=turn_id)
            with contextlib.suppress(Exception):
                await self._end_by_code(turn_id, "failed", "internal_error", "the hub failed to run this turn")

    async def _run_turn(self, turn_id: str) -> None:
        turn = await asyncio.to_thread(self._turn, turn_id)
        stop = self.stops[turn_id]
        shown: str | None = None
        while (place := await self._wait_for_runner(turn, stop, shown)) is not None:
            assert place.runner is not None
            try:
                ended = await self._attempt(turn, place, stop)
            except BaseException:  # cancelled, or another replica drives it: the turn may still run in Hermes,
                self.slot_of.pop(turn.id, None)  # so its slot row holds until the turn has ended
                raise
            finally:
                self.per_runner[place.runner.id] -= 1  # the slot _wait_for_runner took
            await self._free_slot(place.runner.id, turn.id)
            if ended:
                return
            # nothing was submitted: back to step 2 after a pause (chat.md 5.3), one turn.waiting per reason change
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), self.timings.pre_submit_retry_s)
            shown = (await asyncio.to_thread(self._turn, turn_id)).waiting_reason

    async def _attempt(self, turn: ChatTurn, place: Place, stop: asyncio.Event) -> bool:
        """One try of steps 3-10 on ``place``'s runner: True once the turn ended (or went to recovery), False if
        the runner went away or refused before anything was submitted and the turn waits for it again."""
        assert place.runner is not None
        runner = place.runner
        conversation = place.conversation
        if not await asyncio.to_thread(self._still_allowed, turn, conversation):
            await self._end_by_code(turn.id, "failed", ACCESS_REVOKED, "the account lost access to this bot")
            return True
        bound = conversation["runner_id"]
        node_changed = bound is not None and bound != runner.id
        resume_id = None
        if not node_changed and bound == runner.id and conversation["session_reusable"]:
            resume_id = conversation["hermes_session_id"]
        account = AccountRef(turn.owner, turn.tenant, turn.auth_version)
        # the previous turn's end is stored before its channel is kept or closed (chat.md 5.3 step 10): wait for that
        await self.kept.settled(conversation["id"])
        kept = self.kept.take(conversation["id"], runner.id, account, resume_id) if resume_id is not None else None
        if kept is not None and self.leases.shared and not await self._still_owned(kept, conversation["bot_profile"]):
            self.kept.discard(kept)
            kept = None
        if resume_id is None:
            self.kept.close_conversation(conversation["id"])
        channel = LiveChannel(kept.gateway, kept.runtime_id, kept.stored_id) if kept is not None else None
        entitled = await asyncio.to_thread(self._team_entitled, turn, conversation)
        tools = entitled and await self._team_tools_ready(runner.id, account, conversation["bot_profile"])
        stream = TurnStream(self.store, self.clock, self.events, conversation["id"], turn.id,
                            conversation["bot_id"], self.drafts, self.fence)  # fmt: skip
        self.streams[turn.id] = stream
        carry = prompts.NONE

        async def prompt_for(result: TurnResult) -> str:
            nonlocal carry
            stream.result = result
            if node_changed:
                carry = prompts.NODE_CHANGED
            elif not result.resumed and conversation["hermes_session_id"] is not None:
                carry = prompts.SESSION_RESTORED if result.resume_refused else prompts.SESSION_REPLACED
            assert result.gateway is not None
            refs = await send_attachments(
                self.driver.channels, result.gateway, self.store, self.clock, runtime_id=result.runtime_id,
                runner_id=runner.id, conversation_id=conversation["id"], message_id=turn.trigger_message_id,
            )  # fmt: skip
            return await asyncio.to_thread(self._prompt, turn, conversation, carry, not result.resumed, refs)

        async def before_submit(result: TurnResult) -> None:
            team = TeamTools(entitled, tools)
            await asyncio.to_thread(self._submit_record, turn.id, runner, result, carry, node_changed, team)

        async def after_submit(result: TurnResult) -> None:
            await asyncio.to_thread(self._submitted, turn.id)

        async def on_result(result: TurnResult) -> None:  # the end is stored before the channel's cleanup
            await self._finish(turn.id, stream, result, stop.is_set())

        def keep(result: TurnResult) -> bool:  # chat.md 5.3 step 4: a completed turn's channel waits for the next
            completed = stream.ended_state == "completed"
            if not completed or self.stopping or result.gateway is None:
                return False
            live = Kept(conversation["id"], conversation["bot_id"], account, result.gateway, result.runtime_id,
                        stream.stored_id or result.stored_id)  # fmt: skip
            self.kept.keep(live)
            return True

        settling = self.kept.settling(conversation["id"])
        try:
            await self.driver.run(
                runner_id=runner.id, account=account,
                profile=conversation["bot_profile"], work_id=conversation["id"], prompt="", tools=tools, probed=True,
                deadline_ms=self.clock.now_ms() + self.settings.chat_turn_max_s * 1000,
                hooks=TurnHooks(before_submit, after_submit, interrupt_abandoned=lambda: self._may_interrupt(turn.id),
                                before_close=stream.settle_answers, on_result=on_result, read_session_info=True),
                resume_id=resume_id, marker=f"[talaria-run:{turn.id}:{turn.trigger_message_id}]",
                on_frame=stream.on_frame, stop=stop, prompt_for=prompt_for, channel=channel, keep=keep,
                toolset=RoundTools(self.team_calls, turn, conversation, runner.id)
                if tools and self.team_calls is not None else None,
            )  # fmt: skip
        except TalariaError as exc:
            if exc.code in WAIT_AGAIN and not stop.is_set() and await asyncio.to_thread(self._unsubmitted, turn.id):
                log.info("chat_turn_waiting_again", turn=turn.id, code=exc.code)
                stream.close()
                return False
            await self._after_error(turn.id, stream, exc)
            return True
        finally:
            self.streams.pop(turn.id, None)
            self.kept.release(conversation["id"], settling)
        if stream.bound_id is not None and stream.stored_id not in (None, stream.bound_id):
            await asyncio.to_thread(self._session_moved, conversation["id"], runner.id, stream.bound_id,
                                    str(stream.stored_id))  # fmt: skip
        return True

    def _may_interrupt(self, turn_id: str) -> bool:
        """Whether a turn left without its end interrupts its session: not when this hub stops (start-up or another
        replica recovers it) nor when another replica took its lease (that one drives it now)."""
        return not self.stopping and turn_id not in self.lost

    def _session_moved(self, conversation_id: str, runner_id: str, was: str, now_id: str) -> None:
        """The end-of-turn ``session.info`` named a new stored session (chat.md 2, Binding)."""
        with self.store.write() as tx:
            tx.run("chat_conversation_session_moved", id=conversation_id, runner_id=runner_id, was=was,
                   hermes_session_id=now_id, now=self.clock.now_ms())  # fmt: skip

    async def _wait_for_runner(self, turn: ChatTurn, stop: asyncio.Event, reason: str | None) -> Place | None:
        """The place to run ``turn`` once its runner is connected and has room; None if the turn ended meanwhile
        (stopped, or ``runner_offline`` after ``chat.pending_wait_s``). A place returned holds one of its runner's
        ``chat.per_runner`` slots, which the caller gives back. ``reason``: the waiting reason already shown, if
        any. While the hub drains (operations.md 3.4) the turn waits as it is, without giving up: it starts after the
        restart."""
        self.waiting.add(turn.id)
        try:
            return await self._until_placed(turn, stop, reason)
        finally:
            self.waiting.discard(turn.id)

    async def _until_placed(self, turn: ChatTurn, stop: asyncio.Event, reason: str | None) -> Place | None:
        give_up = turn.created_at + self.settings.chat_pending_wait_s * 1000
        while True:
            if self.draining:
                with contextlib.suppress(TimeoutError):
                    await within(stop.wait(), self.timings.runner_back_check_s)
                if stop.is_set():
                    return None
                continue
            place = await asyncio.to_thread(self._place, turn)
            runner = place.runner
            if runner is not None and runner.enabled and self.runners.accepts_work(runner.id):
                if self.per_runner.get(runner.id, 0) < self.settings.chat_per_runner:
                    # taken here, with no await between the count and the taking: turns arriving together would
                    # all see a free slot if it were taken later (the caller gives it back after the attempt)
                    self.per_runner[runner.id] = self.per_runner.get(runner.id, 0) + 1
                    try:
                        taken = await self._take_slot(runner.id, turn.id)  # the cluster's count (scale.md 3.7)
                    except BaseException:  # a store error or a cancel: the local count is given back too
                        self.per_runner[runner.id] -= 1
                        raise
                    if taken:
                        return place
                    self.per_runner[runner.id] -= 1
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
                await within(stop.wait(), self.timings.runner_back_check_s)

    async def _take_slot(self, runner_id: str, turn_id: str) -> bool:
        slot = await asyncio.to_thread(self.slots.take, runner_id, turn_id, self.settings.chat_per_runner)
        if slot is None:
            return False
        self.slot_of[turn_id] = slot
        return True

    async def _free_slot(self, runner_id: str, turn_id: str) -> None:
        slot = self.slot_of.pop(turn_id, None)
        if slot is not None:
            with contextlib.suppress(TalariaError):  # else it is free once the turn has ended
                await asyncio.to_thread(self.slots.free, runner_id, slot, turn_id)

    def _unsubmitted(self, turn_id: str) -> bool:
        """The turn is still ``pending`` and nothing of it went to Hermes: no submit record, no attachment sent (its
        bytes are gone, so another try could not send it again)."""
        with self.store.read() as tx:
            turn = get_turn(tx, turn_id)
            rows = tx.all("chat_attachment_of_messages", conversation_id=turn.conversation_id)
        sent = any(r["message_id"] == turn.trigger_message_id and r["state"] != "attached" for r in rows)
        return turn.state == "pending" and turn.submit_state == "none" and not sent

    def _waiting(self, turn_id: str, reason: str) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            turn = lock_turn(tx, turn_id)
            if turn.state != "pending":
                return []
            set_turn(tx, turn, self.clock.now_ms(), waiting_reason=reason)
            return [("turn.waiting", {"turnId": turn_id, "waitingReason": reason})]

        self._write(self._conversation_of(turn_id), write, fence=turn_id)

    def _prompt(self, turn: ChatTurn, conversation: Row, carry: str, new_session: bool, refs: list[str]) -> str:
        with self.store.read() as tx:
            trigger = tx.one("chat_message_get", conversation_id=conversation["id"], id=turn.trigger_message_id)
            earlier: list[prompts.Earlier] = []
            if carry != prompts.NONE:
                rows = tx.all("chat_message_transcript", conversation_id=conversation["id"],
                              limit=prompts.CARRY_MESSAGES + 1)  # fmt: skip
                held = of_messages(tx, conversation["id"])
                earlier = [
                    prompts.Earlier(r["role"], r["content"], [(a.name, a.node_path) for a in held.get(r["id"], [])])
                    for r in rows
                    if r["id"] != turn.trigger_message_id
                ]
        assert trigger is not None
        text = turn.prompt if turn.trigger == "automatic" and turn.prompt else trigger["content"]
        return prompts.prompt_text(
            text=text, instructions=conversation["bot_instructions"], new_session=new_session, carry=carry,
            earlier=earlier, file_refs=refs,
        )  # fmt: skip

    def _team_entitled(self, turn: ChatTurn, conversation: Row) -> bool:
        """Chat.md 5.9: a turn gets the team catalog when its bot has effective team permission (team-tools.md 2);
        while the ``team`` set is not installed, the catalog is ``talaria_whoami`` alone, for an owner with
        ``canManageTeam``."""
        account = self.accounts.get(turn.owner)
        can_manage = account is not None and account.tenant == turn.tenant and account.can_manage_team
        if self.team_calls is None:
            return can_manage
        return team_round.entitled(self.store, turn, can_manage, conversation["bot_id"])

    async def _still_owned(self, kept: Kept, profile: str) -> bool:
        """Whether the kept channel still owns its session in the runner (ADR 0067): on PostgreSQL replicas another
        replica may have resumed the session in a channel of its own since (a turn of the conversation it ran, or an
        attempt of this one before it died), and the runner then refuses this channel's calls. One
        ``session.active_list``, before the submit record, so that a refusal costs a new channel and nothing else."""
        params = {"profile": profile, "current_session_id": kept.runtime_id}
        try:
            await self.driver.channels.rpc(kept.gateway, "session.active_list", params)
        except TalariaError as exc:
            log.info("chat_kept_channel_stale", conversation=kept.conversation_id, code=exc.code)
            return False
        return True

    async def _team_tools_ready(self, runner_id: str, account: AccountRef, profile: str) -> bool:
        """Whether the runner offers ``team-tools-v1`` and its plugin probe (runner-protocol.md 12.1) is ready."""
        state = self.runners.state_of(runner_id)
        if state is None or "team-tools-v1" not in state.features:
            return False
        try:
            await self.driver.capabilities(runner_id, account, profile)
        except TalariaError as exc:
            log.info("chat_team_tools_unavailable", runner_id=runner_id, code=exc.code)
            return False
        return True

    def _submit_record(
        self, turn_id: str, runner: RunnerRecord, result: TurnResult, carry: str, node_changed: bool, team: TeamTools
    ) -> None:
        """Chat.md 5.3 step 8, one transaction: if it fails, nothing is submitted. A turn entitled to team tools
        that runs without them stores the notice of chat.md 5.9 in the same transaction, and the turn's channel is
        recorded in it (scale.md 4.4)."""

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            now = self.clock.now_ms()
            turn = lock_turn(tx, turn_id)
            if turn.state != "pending" or turn.stop_requested:
                raise TalariaError("turn_finished", "the turn ended before it was submitted")
            set_turn(
                tx, turn, now, state=next_state("pending", "submit"), submit_state="submitting", runner_id=runner.id,
                hermes_session_id=result.stored_id, marker=result.marker, carry=carry, submitted_at=now,
                waiting_reason=None, team_tools=team.offered,
            )  # fmt: skip
            tx.run("chat_conversation_bind", id=turn.conversation_id, runner_id=runner.id,
                   hermes_session_id=result.stored_id, session_reusable=0, now=now)  # fmt: skip
            gateway = result.gateway
            if gateway is not None:  # what a replica taking the turn over adopts (scale.md 4.4)
                tx.run("chat_turn_channel", id=turn_id, connection_id=gateway.id, first_seq=gateway.last_seq + 1,
                       runtime_session_id=result.runtime_id)  # fmt: skip
            texts = [prompts.NODE_SWITCH_MESSAGE.format(name=runner.name)] if node_changed else []
            if team.entitled and not team.offered:
                texts.append(TEAM_TOOLS_UNAVAILABLE)
            emits: list[tuple[str, dict[str, Any]]] = []
            for text in texts:
                notice = NewMessage(role="system", author="talaria", content=text, turn_id=turn.id)
                stored = store_message(tx, turn.conversation_id, notice, now)
                emits.append(("message.complete", {"turnId": turn.id, "message": message_json(stored)}))
            return emits

        self._write(self._conversation_of(turn_id), write, fence=turn_id)

    def _submitted(self, turn_id: str) -> None:
        with self.store.write() as tx:
            self.fence(tx, turn_id)
            turn = lock_turn(tx, turn_id)
            if turn.submit_state == "submitting":
                set_turn(tx, turn, self.clock.now_ms(), submit_state="submitted")

    async def _after_error(self, turn_id: str, stream: TurnStream, exc: TalariaError) -> None:
        turn = await asyncio.to_thread(self._turn, turn_id)
        if turn.ended:
            stream.close()
            return
        if await self._end_for(turn_id, stream, exc):
            return
        if turn.submit_state == "none":
            await asyncio.to_thread(self._end, turn_id, stream, "failed", exc.code, exc.message, None, None)
        elif exc.code == "turn_finished":
            stream.close()
        else:  # submitted, or maybe: never submit again; only the history can tell
            log.info("chat_turn_lost", turn=turn_id, code=exc.code, submit_state=turn.submit_state)
            stream.close()
            await self._recover(turn_id)  # which makes it recovering first
