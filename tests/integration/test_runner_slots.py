"""A runner's slots across replicas (scale.md 3.7) on a real PostgreSQL database, at their edges: a dispatch slot
is held while the job lease it was taken under lives (or for 30 s before a claim records one) and free once that
lease expired or the slot was freed; a chat slot is held until its turn has ended; a work item taking a slot gives
up the one it held before."""

from __future__ import annotations

from pathlib import Path

import pytest

from talaria.accounts.service import Accounts
from talaria.clock import ManualClock
from talaria.hub.runners.slots import CLAIM_GRACE_MS, SharedSlots
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.postgres.store import PostgresStore
from tests.integration.writers_support import Writers, accept, chat_turns, claimed_jobs, seed_conversations

pytestmark = pytest.mark.usefixtures("fast_argon2")


def test_a_dispatch_slot_is_held_while_its_lease_lives(postgres_store: PostgresStore, tmp_path: Path) -> None:
    store = postgres_store
    clock = ManualClock(1_700_000_000_000)
    with store.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
    settings = Settings(data_dir=tmp_path, lifecycle_lease_ttl_s=120)  # longer than the claim grace
    engine = Engine(store, clock, settings)
    (one, lease_one), (two, _lease_two) = claimed_jobs(engine, 2)
    slots = SharedSlots(store, clock, "dispatch")
    assert slots.take("r1", one, 1) == 1
    slots.leased("r1", 1, one, lease_one)
    assert slots.take("r1", two, 1) is None, "the one slot is held by a live lease"
    assert slots.take("r1", two, 2) == 2, "the limit is the number of slots"
    assert slots.take("r1", "job_other", 2) is None
    clock.advance(CLAIM_GRACE_MS / 1000 - 0.001)
    assert slots.take("r1", "job_other", 2) is None, "slot 2 waits for its claim's lease a little longer"
    clock.advance(0.002)
    assert slots.take("r1", "job_other", 2) == 2, "no lease recorded within 30 s: free"
    assert slots.take("r1", two, 1) is None
    clock.advance(settings.lifecycle_lease_ttl_s)  # job one's lease expired
    assert slots.take("r1", two, 1) == 1
    slots.free("r1", 1, two)
    assert slots.take("r1", "job_third", 1) == 1


def test_a_chat_slot_is_held_until_its_turn_ends_and_a_turn_keeps_one_slot(
    postgres_store: PostgresStore, tmp_path: Path
) -> None:
    store = postgres_store
    writers = Writers("", store, store, ManualClock(1_700_000_000_000))
    seed_conversations(store, "cnv_01A", "cnv_01B")
    turns = chat_turns(writers, store, tmp_path)
    first, second = accept(turns, "cnv_01A", "one"), accept(turns, "cnv_01B", "two")
    slots = SharedSlots(store, writers.clock, "chat")
    assert slots.take("r1", first, 1) == 1
    assert slots.take("r1", first, 1) == 1, "its own slot, taken again"
    assert slots.take("r1", second, 1) is None
    assert slots.take("r1", second, 2) == 2
    assert slots.take("r1", second, 1) is None, "slot 1 still its turn's; slot 2 given up for it"
    uma = Accounts(store, writers.clock).get("uma")
    assert uma is not None
    turns.stop(uma, "cnv_01A", first)  # a pending turn ends at once
    assert slots.take("r1", second, 1) == 1
