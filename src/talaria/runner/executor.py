"""Executing commands (runner-protocol.md 8, 9): receipts first, then admission, then the command.

Every command runs in its own task, so a slow one never delays a later ``gateway.close``. A command
already executing in this process is joined on redelivery, never run twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from talaria.clock import Clock
from talaria.runner import receipts as rc
from talaria.runner.errors import CommandError
from talaria.runner.hub_client import HubClient, HubError
from talaria.runner.receipt_writes import ReceiptWrites

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
DISCONNECTING = frozenset({"runner_epoch_changed", "runner_instance_changed"})


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
    ) -> None:
        self.hub = hub
        self.receipts = receipts
        self.clock = clock
        self.handlers = handlers
        self.epoch_is_current = epoch_is_current
        self.on_hub_error = on_hub_error
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
        try:
            begun = await self.writes.run(lambda: self.receipts.begin(command))
        except (ValueError, rc.ReceiptsError):
            await self._post(
                epoch, command["id"], CommandError("runner_command_forbidden", "malformed command").reply()
            )
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
            outcome = await self._execute(command, epoch)
            reply = await self.writes.run(lambda: self._complete(command["id"], outcome))
        await self._post(epoch, command["id"], reply)

    def _complete(self, command_id: str, reply: dict[str, Any]) -> dict[str, Any]:
        """Store the reply, then count the command (every 256th compacts); one trip to a worker thread."""
        stored = self.receipts.complete(command_id, reply)
        self.receipts.handled()
        return stored

    async def _execute(self, command: dict[str, Any], epoch: str) -> dict[str, Any]:
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
