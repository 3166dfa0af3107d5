"""This hub as one replica of a PostgreSQL cluster (scale.md 1, 3.6; ADR 0044).

A replica mints ``rep_<ULID>`` at start and renews its ``hub_replica`` row (release, settings digest) every 5 s; it
is live until 20 s after the last renewal. One that could not renew for 15 s answers ``/readyz`` 503
``store_unavailable`` and drops its role leases. Its clock is compared with the database server's at start (above
``database.max_clock_skew_ms`` the hub refuses to start) and every 60 s (above: ``/readyz`` 503 ``clock_skew`` and no
role leases).

Role leases (``hub_role_lease``: ``runner_watchdog``, ``audit_sealer``, ``maintenance``) are taken by a conditional
update when free, expired or already held (the counter grows on each take), with a 15 s TTL renewed on every round;
a holder stops acting 10 s after its last successful renewal, before anyone else may take the role. Leases only save
work: everything done under one is conditional anyway.

These timings are the cluster's, so the replica keeps wall-clock time whatever clock the hub's business uses (tests
drive a hub with a manual clock). On SQLite there is one hub per directory (``hub.lock``): it holds every role and
has no row.
"""

from __future__ import annotations

import dataclasses
import threading

import structlog

from talaria import __version__
from talaria.canonical import digest
from talaria.clock import Clock, SystemClock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.settings import Settings
from talaria.store.interface import Store, Tx

log = structlog.get_logger("talaria.hub")

ROLES = ("runner_watchdog", "audit_sealer", "maintenance")
LIVE_MS = 20_000
STALE_MS = 15_000
ROLE_TTL_MS = 15_000
ROLE_ACTS_MS = 10_000
PRUNE_AFTER_MS = 3_600_000


def settings_digest(settings: Settings) -> str:
    """A digest of the effective settings without the secret ones (the fields kept out of ``repr``): replicas must
    share their settings, and each one's digest shows whether they do."""
    shown = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.repr}
    return digest({key: str(value) for key, value in shown.items()})


def new_replica_id(clock: Clock | None = None) -> str:
    """``rep_<ULID>``: minted before the store opens, so its connections are named ``talaria/<id>`` (scale.md 2.2)."""
    return mint("rep", (clock or SystemClock()).now_ms())


class Replica:
    def __init__(
        self, store: Store, settings: Settings, *, clock: Clock | None = None, renew_s: float = 5.0,
        clock_check_s: float = 60.0, replica_id: str | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._clock = clock or SystemClock()
        self._renew_s = renew_s
        self._clock_check_ms = int(clock_check_s * 1000)
        self._max_skew_ms = settings.database_max_clock_skew_ms
        self.clustered = store.dialect == "postgresql"
        self.id = replica_id or new_replica_id(self._clock)
        self.settings_digest = settings_digest(settings)
        self._renewed_ms = 0
        self._checked_ms = 0
        self._skewed = False
        self.last_skew_ms: int | None = None  # the last measured |clock - server's| (talaria_clock_skew_seconds)
        self._resigned = False  # a draining replica takes no role again
        self._roles: dict[str, int] = {}  # role -> when this replica last renewed it (ms)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ start, rounds, stop

    def join(self) -> None:
        """Check the clock and register (before the hub serves); ``TalariaError`` ``clock_skew`` refuses a start."""
        if not self.clustered:
            return
        skew = self.last_skew_ms = self.skew_ms()
        if skew > self._max_skew_ms:
            limit = self._max_skew_ms
            raise TalariaError("clock_skew", f"this host's clock differs from the database server's by {skew} ms "
                               f"(database.max_clock_skew_ms is {limit}); synchronise the clocks")  # fmt: skip
        now = self._clock.now_ms()
        with self._store.write() as tx:
            tx.run("hub_replica_register", id=self.id, release=__version__, settings_digest=self.settings_digest,
                   now=now)  # fmt: skip
            held = self._take_roles(tx, now)
        self._renewed_ms = self._checked_ms = now
        log.info("replica_started", replica=self.id, release=__version__, settings_digest=self.settings_digest)
        self._hold(held)

    def start(self) -> None:
        if not self.clustered or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="talaria-replica", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._renew_s):
            self.tick()

    def tick(self) -> None:
        """One round: renew the row, check the clock when due, take or renew the roles."""
        now = self._clock.now_ms()
        try:
            if now - self._checked_ms >= self._clock_check_ms:
                self._check_clock(now)
            with self._store.write() as tx:  # one transaction a round: the row, the pruning, the roles
                if tx.run("hub_replica_renew", id=self.id, now=now) == 0:  # pruned while away: join again
                    tx.run("hub_replica_register", id=self.id, release=__version__,
                           settings_digest=self.settings_digest, now=now)  # fmt: skip
                tx.run("hub_replica_prune", before=now - PRUNE_AFTER_MS)
                held = self._take_roles(tx, now)
            self._renewed_ms = now
            self._hold(held)
        except TalariaError as exc:
            log.warning("replica_renew_failed", replica=self.id, code=exc.code)
            if now - self._renewed_ms >= STALE_MS:
                with self._lock:
                    self._roles.clear()

    def _check_clock(self, now: int) -> None:
        skew = self.skew_ms()
        self.last_skew_ms = skew
        self._checked_ms = now
        if (skew > self._max_skew_ms) != self._skewed:
            log.warning("replica_clock_skew" if not self._skewed else "replica_clock_back", replica=self.id,
                        skew_ms=skew, max_ms=self._max_skew_ms)  # fmt: skip
        self._skewed = skew > self._max_skew_ms

    def resign(self) -> None:
        """Give every role up and take none again (a draining replica, operations.md 3.4, scale.md 3.6)."""
        self._resigned = True
        with self._lock:
            self._roles.clear()
        if not self.clustered:
            return
        try:
            with self._store.write() as tx:
                tx.run("hub_role_lease_release", holder=self.id)
        except TalariaError as exc:  # the leases expire on their own
            log.warning("replica_resign_failed", replica=self.id, code=exc.code)

    def _take_roles(self, tx: Tx, now: int) -> dict[str, int]:
        """Take or renew every role in ``tx``; none while the clock strays. Returns the roles held, renewed ``now``."""
        if self._skewed or self._resigned:
            return {}
        return {role: now for role in ROLES
                if tx.one("hub_role_lease_take", role=role, holder=self.id, now=now,
                          expires_at=now + ROLE_TTL_MS) is not None}  # fmt: skip

    def _hold(self, held: dict[str, int]) -> None:
        with self._lock:
            gained = held.keys() - self._roles.keys()
            self._roles = held
        for role in sorted(gained):
            log.info("replica_role_taken", replica=self.id, role=role)

    def stop(self) -> None:
        """Release the roles and leave (a stopping replica, scale.md 3.6)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
        if not self.clustered:
            return
        with self._lock:
            self._roles.clear()
        try:
            with self._store.write() as tx:
                tx.run("hub_role_lease_release", holder=self.id)
                tx.run("hub_replica_leave", id=self.id)
        except TalariaError as exc:  # the row expires on its own; the leases too
            log.warning("replica_leave_failed", replica=self.id, code=exc.code)

    # ------------------------------------------------------------------ what others ask

    def skew_ms(self) -> int:
        """|this clock - the server's|, the server's read halfway through the round trip."""
        before = self._clock.now_ms()
        with self._store.read() as tx:
            row = tx.one("hub_replica_server_time")
        after = self._clock.now_ms()
        server = int(row["now"]) if row else 0
        return abs((before + after) // 2 - server)

    def holds(self, role: str) -> bool:
        """Whether this replica may act as ``role`` now: always on SQLite; on PostgreSQL while its lease was renewed
        within the last 10 s."""
        if not self.clustered:
            return True
        with self._lock:
            renewed = self._roles.get(role)
        return renewed is not None and self._clock.now_ms() - renewed < ROLE_ACTS_MS

    def unready(self) -> TalariaError | None:
        """Why ``/readyz`` answers 503, or None."""
        if not self.clustered:
            return None
        if self._clock.now_ms() - self._renewed_ms >= STALE_MS:
            return TalariaError("store_unavailable", "this replica could not renew its row for 15 s")
        if self._skewed:
            return TalariaError("clock_skew", "this replica's clock differs from the database server's")
        return None
