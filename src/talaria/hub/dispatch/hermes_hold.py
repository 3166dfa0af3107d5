"""Nodes whose Hermes is unavailable (ADR 0030): the dispatcher takes no new job for them until Hermes answers.

A job whose turn met ``hermes_unavailable`` before anything was submitted gives its lease back (the next attempt
runs it); its node is then held: a watcher asks the node's Hermes for ``GET /api/status`` after
``timings.hermes_retry_s``, doubling the pause up to ``timings.hermes_retry_max_s``, and lifts the hold (waking
the dispatcher) at the first 200; a runner disabled or deleted meanwhile ends its watch. So an outage costs a
job one attempt, not one per scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable

import structlog

from talaria.errors import TalariaError
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.timings import HubTimings

log = structlog.get_logger("talaria.dispatcher")

# A probe failing with one of these says nothing new: the node stays held. Any other refusal (the account behind
# the probes lost its access, say) lifts the hold, and the next job's own attempt finds out.
STILL_DOWN = frozenset(
    {"hermes_unavailable", "runner_offline", "runner_busy", "runner_command_uncertain", "runner_connection_closed"}
)


class HermesHolds:
    def __init__(
        self,
        channels: Channels,
        timings: HubTimings,
        on_lifted: Callable[[], None],
        still_enabled: Callable[[str], bool],
    ) -> None:
        self.channels = channels
        self.timings = timings
        self.on_lifted = on_lifted
        self.still_enabled = still_enabled  # whether the runner's record still exists and is enabled
        self._watchers: dict[str, asyncio.Task[None]] = {}  # runner id -> its watcher
        self.probes = 0  # status probes sent (tests await a number of them)

    def is_held(self, runner_id: str) -> bool:
        return runner_id in self._watchers

    def hold(self, runner_id: str, account: AccountRef) -> None:
        """Hold the node until its Hermes answers; ``account`` is who the probes are attributed to."""
        if runner_id in self._watchers:
            return
        log.info("dispatcher_hermes_hold", runner_id=runner_id)
        # a context of its own: the watcher outlives the job whose failure started it (no job_id or trace of it)
        task = asyncio.get_running_loop().create_task(self._watch(runner_id, account), context=contextvars.Context())
        self._watchers[runner_id] = task
        task.add_done_callback(lambda ended: self._forget(runner_id, ended))

    def _forget(self, runner_id: str, watcher: asyncio.Task[None]) -> None:
        """Drop the runner's entry if it is still this watcher's (a later hold may have replaced it)."""
        if self._watchers.get(runner_id) is watcher:
            del self._watchers[runner_id]

    async def stop(self) -> None:
        watchers = list(self._watchers.values())
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, runner_id: str, account: AccountRef) -> None:
        pause = self.timings.hermes_retry_s
        while True:
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.timings.hermes_retry_max_s)
            if not await asyncio.to_thread(self.still_enabled, runner_id):  # disabled or deleted: nothing to hold
                del self._watchers[runner_id]  # its own entry: hold() adds none while one exists
                return
            if await self._answers(runner_id, account):
                log.info("dispatcher_hermes_back", runner_id=runner_id)
                del self._watchers[runner_id]  # lifted before the dispatcher scans again
                self.on_lifted()
                return

    async def _answers(self, runner_id: str, account: AccountRef) -> bool:
        self.probes += 1
        try:
            reply = await self.channels.http(runner_id, account, "/api/status")
        except TalariaError as exc:
            log.info("dispatcher_hermes_probe_failed", runner_id=runner_id, code=exc.code)
            return exc.code not in STILL_DOWN
        return reply.get("status") == 200
