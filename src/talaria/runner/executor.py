"""Executing commands (runner-protocol.md 8, 9): receipts first, then admission, then the command.

Every command runs in its own task, so a slow one never delays a later ``gateway.close``. A command
already executing in this process is joined on redelivery, never run twice.

Every command begun is answered (ADR 0019). A reply canonical JSON cannot carry (NaN, Infinity, a lone
surrogate) is stored and posted as ``runner_reply_unrepresentable``, so a redelivery replays that error. A
receipt the file refuses is reported to ``on_receipts_failure`` (the runner stops with exit status 4) and the
command is still answered: with its outcome when it ran, with ``runner_command_uncertain`` when even its
``started`` receipt could not be written or read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from talaria.clock import Clock
from talaria.runner import receipts as rc
from talaria.runner.errors import CommandError
from talaria.runner.hub_client import HubClient, HubError
from talaria.runner.receipt_writes import ReceiptWrites

_log = logging.getLogger("talaria.runner.executor")
Handler = Callable[[dict[str, Any]], Awaitable[Any]]
DISCONNECTING = frozenset({"runner_epoch_changed", "runner_instance_changed"})
UNREPRESENTABLE: Final = "runner_reply_unrepresentable"
UNREPRESENTABLE_MESSAGE: Final = "the reply holds a value JSON cannot carry (NaN, Infinity or a lone surrogate)"


def _log_receipts_failure(exc: rc.ReceiptsError) -> None:
    _log.error("receipts_failed", extra={"error": str(exc)})


def unstorable(exc: ValueError) -> CommandError:
    """The error that replaces a reply ``Receipts.complete`` refused before writing anything."""
    if isinstance(exc, rc.UnrepresentableReply):
        return CommandError(UNREPRESENTABLE, UNREPRESENTABLE_MESSAGE)
    return CommandError("runner_internal_error", "the runner made a reply of the wrong shape")


class Executor:
    def __init__(
        self,
        hub: HubClient,
        receipts: rc.Receipts,
        clock: Clock,
        *,
        handlers: dict[str, Handler],
        epoch_is_current: Callable[[str], bool],
        on_hub_error: Callable[[HubError], Awaitable[None]],
        on_receipts_failure: Callable[[rc.ReceiptsError], None] | None = None,
        refuse: Callable[[dict[str, Any]], CommandError | None] | None = None,
        on_started: Callable[[dict[str, Any]], None] | None = None,
        on_answered: Callable[[dict[str, Any], dict[str, Any], float], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refuse`` may answer a command with an error before ``admit`` (never run: a draining runner's new
        work, operations.md 3.3). ``on_receipts_failure`` is called (on the loop, possibly more than once) for
        every receipt write the file refuses; the daemon's ``Agent`` stops the runner there. Without one (an
        embedding test) the failure is logged as an error. ``on_started`` is called when a new command begins to
        execute, ``on_answered`` with the command, its reply and the seconds from its receipt to the reply (logs and
        metrics, operations.md 5.2-5.3)."""
        self.hub = hub
        self.receipts = receipts
        self.clock = clock
        self.handlers = handlers
        self.epoch_is_current = epoch_is_current
        self.on_hub_error = on_hub_error
        self.on_receipts_failure = on_receipts_failure or _log_receipts_failure
        self.refuse = refuse or (lambda command: None)
        self.on_started = on_started or (lambda command: None)
        self.on_answered = on_answered or (lambda command, reply, seconds: None)
        self._monotonic = monotonic
        self.running: dict[str, asyncio.Task[None]] = {}
        self.writes = ReceiptWrites()

    def submit(self, command: Any, epoch: str) -> None:
        if not isinstance(command, dict) or not isinstance(command.get("id"), str):
            return  # nothing to answer to
        if command["id"] in self.running:
            return  # joined: the running execution posts the one result
        command_id: str = command["id"]
        task = asyncio.get_running_loop().create_task(self._handle(command, epoch))
        self.running[command_id] = task

        def forget(_: asyncio.Task[None]) -> None:
            self.running.pop(command_id, None)

        task.add_done_callback(forget)

    async def drain(self, timeout: float) -> None:
        """Let executing commands finish for at most ``timeout`` seconds."""
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=timeout)

    def cancel_all(self) -> None:
        for task in list(self.running.values()):
            task.cancel()

    async def _handle(self, command: dict[str, Any], epoch: str) -> None:
        received = self._monotonic()
        try:
            begun = await self.writes.run(lambda: self.receipts.begin(command))
        except ValueError:
            await self._post(
                epoch, command["id"], CommandError("runner_command_forbidden", "malformed command").reply()
            )
            return
        except rc.ReceiptsError as exc:
            # Not run; but an unreadable file may hide an earlier run of this id, so never "not executed".
            self.on_receipts_failure(exc)
            uncertain = CommandError("runner_command_uncertain", rc.UNCERTAIN_MESSAGE)
            await self._post(epoch, command["id"], uncertain.reply())
            return
        if isinstance(begun, rc.Running):
            return
        if isinstance(begun, rc.Conflict):
            reply = CommandError("idempotency_conflict", "this command id was used for another command").reply()
        elif isinstance(begun, rc.Stored):
            reply = begun.reply
        elif isinstance(begun, rc.Uncertain):
            reply = CommandError("runner_command_uncertain", begun.message).reply()
        else:
            self.on_started(command)
            outcome = await self._execute(command, epoch)
            reply = await self._finish(command["id"], outcome)
        self.on_answered(command, reply, self._monotonic() - received)
        await self._post(epoch, command["id"], reply)

    async def _finish(self, command_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
        """Store the command's reply and return it as it is to be posted. Never raises for the file: a write it
        refuses goes to ``on_receipts_failure`` and the reply is returned unstored (the receipt stays
        ``started``: uncertain after a restart, never replayed)."""
        answer = outcome

        def complete() -> tuple[dict[str, Any], rc.ReceiptsError | None]:
            """Store, then count the command (every 256th compacts); one trip to a worker thread."""
            nonlocal answer
            try:
                stored = self.receipts.complete(command_id, answer)
            except ValueError as exc:  # refused before anything was written
                answer = unstorable(exc).reply()
                stored = self.receipts.complete(command_id, answer)
            try:
                self.receipts.handled()
            except rc.ReceiptsError as exc:  # the reply is stored: post it, then stop
                return stored, exc
            return stored, None

        try:
            stored, failure = await self.writes.run(complete)
        except rc.ReceiptsError as exc:
            self.on_receipts_failure(exc)
            return answer
        if failure is not None:
            self.on_receipts_failure(failure)
        return stored

    async def _execute(self, command: dict[str, Any], epoch: str) -> dict[str, Any]:
        refusal = self.refuse(command)
        if refusal is not None:
            return refusal.reply()
        try:
            await self._admit(command, epoch)
            handler = self.handlers.get(command.get("kind", ""))
            if handler is None or not isinstance(command.get("payload"), dict):
                raise CommandError("runner_command_forbidden", "unknown command kind or malformed payload")
            return {"result": await handler(command)}
        except CommandError as exc:
            return exc.reply()
        except Exception as exc:  # a bug must still end the command with one answer
            return CommandError("runner_internal_error", f"the runner failed: {type(exc).__name__}").reply()

    async def _admit(self, command: dict[str, Any], epoch: str) -> None:
        refused = CommandError("runner_command_not_admitted", "the hub did not admit this command")
        expires = command.get("expiresAt")
        if not isinstance(expires, int) or expires <= self.clock.now_ms():
            raise refused
        try:
            answer = await self.hub.post("admit", epoch, {"id": command["id"]})
        except HubError as exc:
            if exc.code in DISCONNECTING:
                await self.on_hub_error(exc)
            raise refused from exc
        if not (isinstance(answer, dict) and answer.get("allowed") is True) or expires <= self.clock.now_ms():
            raise refused

    async def _post(self, epoch: str, command_id: str, reply: dict[str, Any]) -> None:
        if not self.epoch_is_current(epoch):
            return  # the receipt keeps the reply for a redelivery under the new epoch
        try:
            await self.hub.post("result", epoch, {"id": command_id, **reply})
        except HubError as exc:
            if exc.code in DISCONNECTING:
                await self.on_hub_error(exc)
