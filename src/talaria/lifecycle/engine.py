"""The engine: every entry point of lifecycle.md 1, bound to one store, clock and settings.

One layer: the entry points are this class's methods, defined by concern in ``tasks.TaskEntries``
(tasks and dispatch), ``leasing.LeaseEntries`` (claim, start, heartbeat), ``endings.EndEntries``
(complete, fail, cancel), ``release.ReleaseEntries`` (the holder's release) and ``reads.ReadEntries``
(status, discovery, the web API's reads). Callers differ only in the ``Actor`` they pass. Each mutating
call is one write transaction and returns a typed record or ``answers.Reply``, or raises ``TalariaError``
with a code of lifecycle.md 6.7.
"""

from __future__ import annotations

from talaria.lifecycle import audit, recovery
from talaria.lifecycle.context import Listener, Signals
from talaria.lifecycle.endings import EndEntries
from talaria.lifecycle.leasing import LeaseEntries
from talaria.lifecycle.orchestrator import Orchestrator
from talaria.lifecycle.reads import ReadEntries
from talaria.lifecycle.release import ReleaseEntries
from talaria.lifecycle.tasks import TaskEntries


class Engine(TaskEntries, LeaseEntries, EndEntries, ReleaseEntries, ReadEntries):
    orchestrator = Orchestrator

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(signal, job_id)`` after each COMMIT; see ``Context``."""
        self.listeners.append(listener)

    def emit(self, signals: Signals) -> None:
        """Call the listeners for the signals of a transaction the caller committed (``policy.dispatch_by_policy``
        runs inside the reconciler's own transaction)."""
        self._emit(signals)

    def expire_due(self) -> int:
        """One reaper sweep (tests call this instead of running the periodic reaper)."""
        return recovery.sweep(self)

    def recover(self) -> recovery.RecoveryReport:
        """Start-up recovery (lifecycle.md 10); raises ``RecoveryError`` when start-up must stop."""
        return recovery.recover(self)

    def cancel_unended(self, reason: str) -> int:
        """A restore's cancel of every unfinished job by the recovery actor (operations.md 7.2)."""
        return recovery.cancel_unended(self, reason)

    def verify_audit(self) -> audit.ChainReport:
        return audit.verify(self.store)
