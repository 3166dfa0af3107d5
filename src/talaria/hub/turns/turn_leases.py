"""Which replica drives a chat turn (scale.md 4.3): the holder of its ``turn_lease``.

A replica's chat engine takes a turn's lease before it runs a ``pending`` turn or recovers a ``running`` or
``recovering`` one, and gives it back when it is done with the turn. A lease is taken when it is free, expired (TTL
30 s, renewed every 10 s) or held by a replica no longer live (``hub_replica`` not renewed for 20 s); each take makes
the counter grow. The owner's writes of the turn (submit record, messages, end) are fenced by that counter in their
own transaction (``check``): once another replica has taken the lease, the old owner's next write fails with
``LeaseLost`` and its task stops, so a turn never has two drivers writing it.

On SQLite one hub drives every turn (``hub.lock``): ``LocalTurnLeases`` grants every pending turn, and the running
and recovering ones only at the first scan after start-up (what a restart left), as before.

Lease times are the cluster's, so they are kept on the wall clock whatever clock the hub's business uses.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from talaria.clock import Clock, SystemClock
from talaria.errors import TalariaError
from talaria.hub.replica import LIVE_MS
from talaria.hub.runners.transport import TurnHeld
from talaria.store.interface import Store, Tx

log = structlog.get_logger("talaria.chat")

TTL_MS = 30_000
RENEW_S = 10.0
GIVE_UP_MS = 20_000  # an owner that could not renew for this long stops driving its turns


class LeaseLost(Exception):
    """Another replica took the turn's lease: this one must stop driving the turn, writing nothing more."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id


class TurnLeases(Protocol):
    renew_s: float
    shared: bool  # replicas: another hub may drive a turn of the same conversation

    def take(self, turn_id: str, *, unstarted: bool, first_scan: bool) -> int | None:
        """The lease's token if this replica now drives the turn, else None. ``unstarted``: the turn is pending."""
        ...

    def check(self, tx: Tx, turn_id: str, token: int) -> None:
        """Inside an owner's write: raise ``LeaseLost`` unless the lease is still this replica's at ``token``."""
        ...

    def renew(self, held: dict[str, int]) -> set[str] | None:
        """Renew the leases of ``held`` (turn id -> token); the ids no longer held, or None when the store did not
        answer (the caller counts how long that lasts)."""
        ...

    def release(self, turn_id: str, token: int) -> None:
        """Done with the turn: free for another replica at once (its row dropped once the turn has ended)."""
        ...

    def elsewhere(self) -> set[str]:
        """The turns another live replica drives now (the scan does not try to take them)."""
        ...

    def release_all(self) -> None:
        """A stopping replica lets go of every turn it drives."""
        ...

    def holding(self, turn_id: str, token: int) -> TurnHeld | None:
        """What adopting the turn's channel is conditional on (scale.md 4.4): this replica's lease at ``token``;
        None where channels die with their hub."""
        ...


class LocalTurnLeases:
    """One hub per SQLite directory: every turn is this hub's."""

    renew_s = RENEW_S
    shared = False

    def take(self, turn_id: str, *, unstarted: bool, first_scan: bool) -> int | None:
        return 0 if unstarted or first_scan else None

    def check(self, tx: Tx, turn_id: str, token: int) -> None:
        return None

    def renew(self, held: dict[str, int]) -> set[str] | None:
        return set()

    def release(self, turn_id: str, token: int) -> None:
        return None

    def elsewhere(self) -> set[str]:
        return set()

    def release_all(self) -> None:
        return None

    def holding(self, turn_id: str, token: int) -> TurnHeld | None:
        return None  # a SQLite hub's channels die with it: nothing to adopt


class SharedTurnLeases:
    """Turn leases of PostgreSQL replicas in the ``turn_lease`` table."""

    shared = True

    def __init__(self, store: Store, holder: str, *, clock: Clock | None = None, renew_s: float = RENEW_S) -> None:
        self.store = store
        self.holder = holder
        self.clock = clock or SystemClock()
        self.renew_s = renew_s

    def take(self, turn_id: str, *, unstarted: bool, first_scan: bool) -> int | None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            row = tx.one("turn_lease_take", turn_id=turn_id, holder=self.holder, expires_at=now + TTL_MS, now=now,
                         since=now - LIVE_MS)  # fmt: skip
        if row is None:
            return None
        log.info("chat_turn_lease_taken", turn=turn_id, replica=self.holder, counter=int(row["counter"]))
        return int(row["counter"])

    def check(self, tx: Tx, turn_id: str, token: int) -> None:
        if tx.one("turn_lease_fence", turn_id=turn_id, holder=self.holder, counter=token) is None:
            raise LeaseLost(turn_id)

    def renew(self, held: dict[str, int]) -> set[str] | None:
        if not held:
            return set()
        try:
            with self.store.write() as tx:
                rows = tx.all("turn_lease_renew", holder=self.holder, turn_ids=sorted(held),
                              expires_at=self.clock.now_ms() + TTL_MS)  # fmt: skip
        except TalariaError as exc:
            log.warning("chat_turn_lease_renew_failed", replica=self.holder, code=exc.code)
            return None
        still = {row["turn_id"] for row in rows if int(row["counter"]) == held[row["turn_id"]]}
        return set(held) - still

    def release(self, turn_id: str, token: int) -> None:
        with self.store.write() as tx:
            if tx.run("turn_lease_drop", turn_id=turn_id, holder=self.holder, counter=token) == 0:
                tx.run("turn_lease_release", turn_id=turn_id, holder=self.holder, counter=token)

    def elsewhere(self) -> set[str]:
        now = self.clock.now_ms()
        with self.store.read() as tx:
            rows = tx.all("turn_lease_elsewhere", holder=self.holder, now=now, since=now - LIVE_MS)
        return {row["turn_id"] for row in rows}

    def release_all(self) -> None:
        with self.store.write() as tx:
            tx.run("turn_lease_release_all", holder=self.holder)

    def holding(self, turn_id: str, token: int) -> TurnHeld | None:
        return TurnHeld(turn_id, self.holder, token)
