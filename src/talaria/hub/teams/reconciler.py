"""The hub component running team tools' reconciler (team-tools.md 4.1): a pass on every signal (a tool's change,
a job's end, a chat turn's end) and at least every ``team_reconcile_s``, each on a worker thread; after it, the
engine's signals, chat's announcements of delivered messages and wakes, and the ``team.goal`` stream event of each
goal whose status or assignments' statuses changed (team-tools.md 7 "Stream"). ``run_once`` is the start-up pass,
after lifecycle and chat recovery and before the listener opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog

from talaria.hub.chat.stream_events import StreamEvents
from talaria.hub.turns.chat_engine import ChatEngine
from talaria.lifecycle.engine import Engine
from talaria.store.interface import Store
from talaria.teams import reads
from talaria.teams.reconcile import Reconcile
from talaria.teams.steps import Effects
from talaria.timeouts import within

log = structlog.get_logger("talaria.teams")
TURN_ENDS = frozenset({"turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain"})


class TeamReconciler:
    def __init__(
        self, reconcile: Reconcile, *, store: Store, engine: Engine, chat: ChatEngine, events: StreamEvents,
        interval_s: float, may_run: Callable[[], bool] = lambda: True,
    ) -> None:  # fmt: skip
        self.reconcile = reconcile
        reconcile.deliveries.stage = chat.stage_enqueued
        self.may_run = may_run  # PostgreSQL: the replica holding ``maintenance`` runs the passes (ADR 0051)
        self.store = store
        self.engine = engine
        self.chat = chat
        self.events = events
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._shown: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
        self._shown_lock = threading.Lock()
        engine.add_listener(lambda signal, job_id: self.wake() if signal == "terminal" else None)
        events.listeners.append(lambda kind: self.wake() if kind in TURN_ENDS else None)

    def wake(self) -> None:
        """Run a pass soon (any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def applied(self, goal_id: str | None) -> None:
        """A tool call changed ``goal_id`` (any thread): its ``team.goal`` event if its statuses moved, and a pass."""
        if goal_id is not None:
            self._show(goal_id)
        self.wake()

    def run_once(self) -> Effects:
        """One pass now, on the calling thread, and what follows it; nothing on a replica not holding
        ``maintenance`` (another replica's passes do it, at least every ``team_reconcile_s``)."""
        if not self.may_run():
            return Effects()
        effects = self.reconcile.run()
        self._after(effects)
        return effects

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._main())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _main(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await within(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await asyncio.to_thread(self.run_once)
            except Exception:  # a pass must never stop the component; the next one retries
                log.exception("team_reconcile_failed")

    def _after(self, effects: Effects) -> None:
        if effects.signals:
            self.engine.emit(effects.signals)
        for staged in effects.staged:
            self.chat.announce(staged)
        for goal_id in sorted(effects.goals):
            self._show(goal_id)

    def _show(self, goal_id: str) -> None:
        """Emit ``team.goal`` in the goal's origin conversation when its status or counts differ from the last
        shown."""
        with self.store.read() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None:
                return
            view = goal.view(reads.assignments(tx, goal.id))
        counts = tuple(sorted(view["counts"].items()))
        with self._shown_lock:
            if self._shown.get(goal_id) == (goal.status, counts):
                return
            self._shown[goal_id] = (goal.status, counts)
        data: dict[str, Any] = {"goalId": goal.id, "teamId": goal.team_id, "status": goal.status,
                                "revision": goal.revision, "counts": view["counts"]}  # fmt: skip
        try:
            self.events.emit(goal.origin_conversation_id, "team.goal", data)
        except Exception as exc:  # the conversation is gone: nobody can be following it
            log.info("team_goal_event_dropped", goal=goal.id, error=type(exc).__name__)
