"""Write paths under two writers of one PostgreSQL database, as two hub replicas run them (scale.md 2.3, 3.7): the
first writer's transaction is held at its COMMIT while the second runs until it waits for a lock the first holds
(or finishes); then the first commits. Each test shows the second writer's answer is the one a user should get
(a 409 or the next ordinal), never a unique violation's 503.

Each store here is its own writer (its own in-process write lock), as each replica's is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from talaria.accounts.service import Accounts
from talaria.chat.bots import Bots
from talaria.chat.turn_writes import NewMessage, store_message
from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.dispatch.job_turns import JobTurn, JobTurns, TurnMoveRefused
from talaria.hub.runners.registry import RunnerRegistry, parse_registration
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.postgres.store import PostgresStore
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database
from tests.conftest import PASSWORD
from tests.integration.writers_support import Writers, accept, chat_turns, claimed_jobs, seed_conversations

pytestmark = pytest.mark.usefixtures("fast_argon2")


@pytest.fixture
def writers(postgres_server: PostgresServer) -> Iterator[Writers]:
    with postgres_database(postgres_server, migrated=True) as url:
        a, b = PostgresStore(url), PostgresStore(url)
        try:
            yield Writers(url, a, b, ManualClock(1_700_000_000_000))
        finally:
            a.close()
            b.close()


class HeldAtCommit:
    """A fault hook holding the first transaction that reaches COMMIT until ``go`` is set."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, name: str) -> None:
        if name == "commit" and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(20), "the test never let the first writer commit"


def lock_waiters(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def outcome_of(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except TalariaError as exc:
        return exc


def interleaved(writers: Writers, first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """``first`` (on store a) held at its COMMIT, ``second`` (on store b) run until it waits for a lock or ends, then
    ``first`` commits: both outcomes (a value or the ``TalariaError`` raised)."""
    held = HeldAtCommit()
    writers.a.fault_hook = held
    with ThreadPoolExecutor(max_workers=2) as pool:
        one = pool.submit(outcome_of, first)
        assert held.reached.wait(20), one.result(0) if one.done() else "the first writer never reached COMMIT"
        writers.a.fault_hook = None
        two = pool.submit(outcome_of, second)
        waited = False
        while not two.done() and not (waited := lock_waiters(writers.url) > 0):
            threading.Event().wait(0.005)  # polling the server's view of lock waits, the event this waits on
        held.go.set()
        results = one.result(20), two.result(20)
    assert waited or results[1] is not None
    return results


def test_a_concurrent_account_create_answers_account_exists(writers: Writers) -> None:
    a, b = Accounts(writers.a, writers.clock), Accounts(writers.b, writers.clock)
    made, refused = interleaved(
        writers,
        lambda: a.create(username="uma", password=PASSWORD, role="user"),
        lambda: b.create(username="uma", password=PASSWORD, role="user"),
    )
    assert not isinstance(made, TalariaError), made
    assert isinstance(refused, TalariaError) and (refused.code, refused.status) == ("account_exists", 409), refused


def test_a_concurrent_registration_of_one_source_answers_runner_source_in_use(writers: Writers) -> None:
    fields = parse_registration(
        {"name": "node", "source": "lab", "allowedProfiles": ["default"]}, default_server_url="http://127.0.0.1:1"
    )
    a, b = RunnerRegistry(writers.a, writers.clock), RunnerRegistry(writers.b, writers.clock)
    made, refused = interleaved(writers, lambda: a.register("default", fields), lambda: b.register("default", fields))
    assert not isinstance(made, TalariaError), made
    assert isinstance(refused, TalariaError) and refused.code == "runner_source_in_use", refused


def test_messages_stored_concurrently_in_one_conversation_take_the_next_ordinals(writers: Writers) -> None:
    seed_conversations(writers.a, "cnv_01TEST")

    def store(on: PostgresStore, text: str) -> int:
        with on.write() as tx:
            message = NewMessage(role="user", author="uma", content=text)
            return store_message(tx, "cnv_01TEST", message, writers.clock.now_ms()).ordinal

    first, second = interleaved(writers, lambda: store(writers.a, "one"), lambda: store(writers.b, "two"))
    assert (first, second) == (1, 2)


@pytest.mark.parametrize(
    ("conversations", "settings", "code"),
    [
        (("cnv_01A", "cnv_01A"), {}, "turn_in_progress"),
        (("cnv_01A", "cnv_01B"), {"chat_per_account": 1}, "chat_turn_limit"),
        (("cnv_01A", "cnv_01B"), {"chat_per_hub": 1}, "chat_busy"),
        # two accounts: no account row lock orders them, only the cluster-wide count's own lock
        (("cnv_01A", "cnv_01U"), {"chat_per_hub": 1}, "chat_busy"),
    ],
)
def test_concurrent_acceptances_keep_one_live_turn_per_conversation_and_the_chat_limits(
    writers: Writers, tmp_path: Path, conversations: tuple[str, str], settings: dict[str, Any], code: str
) -> None:
    seed_conversations(writers.a, *sorted(set(conversations)))
    a = chat_turns(writers, writers.a, tmp_path / "a", **settings)
    b = chat_turns(writers, writers.b, tmp_path / "b", **settings)
    first, second = interleaved(
        writers, lambda: accept(a, conversations[0], "one"), lambda: accept(b, conversations[1], "two")
    )
    assert not isinstance(first, TalariaError), first
    assert isinstance(second, TalariaError) and second.code == code, second
    with writers.a.read() as tx:
        assert tx.one("chat_turn_live_count_all") == {"n": 1}


def test_a_concurrent_bot_of_the_same_name_answers_duplicate_bot_name(writers: Writers, tmp_path: Path) -> None:
    seed_conversations(writers.a)
    account = Accounts(writers.a, writers.clock).get("uma")
    assert account is not None
    a, b = (Bots(store, writers.clock, AuditKey.load(store, tmp_path, 1), lambda *_: True) for store in writers)

    def create(bots: Bots) -> Any:
        return bots.create(account, name="Scout", source="local", profile="default")

    made, refused = interleaved(writers, lambda: create(a), lambda: create(b))
    assert not isinstance(made, TalariaError), made
    assert isinstance(refused, TalariaError) and refused.code == "duplicate_bot_name", refused


def test_a_concurrent_dispatch_of_one_task_answers_not_approved(writers: Writers, tmp_path: Path) -> None:
    a, b = (Engine(store, writers.clock, Settings(data_dir=tmp_path)) for store in writers)
    with writers.a.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
    author = Actor("acct:default/alice", frozenset(), "web", "default")
    admin = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", "default")
    task = a.create_task(
        author, tenant="default", title="x", spec={"prompt": "hi"}, cell="local", profile="default", trace="a" * 32
    )
    a.submit_task(author, tenant="default", task_id=task.id)
    a.approve_task(admin, tenant="default", task_id=task.id)
    first, second = interleaved(
        writers,
        lambda: a.dispatch(admin, tenant="default", task_id=task.id),
        lambda: b.dispatch(admin, tenant="default", task_id=task.id),
    )
    assert not isinstance(first, TalariaError), first
    assert isinstance(second, TalariaError) and second.code == "not_approved", second


def test_two_concurrent_stops_of_a_running_turn_both_answer_with_the_stop_requested(
    writers: Writers, tmp_path: Path
) -> None:
    seed_conversations(writers.a, "cnv_01A")
    a, b = chat_turns(writers, writers.a, tmp_path / "a"), chat_turns(writers, writers.b, tmp_path / "b")
    turn_id = accept(a, "cnv_01A", "one")
    with writers.a.write() as tx:  # as the engine's submit record left it
        tx.script(f"UPDATE chat_turn SET state = 'running', revision = revision + 1 WHERE id = '{turn_id}'")
    account = Accounts(writers.a, writers.clock).get("uma")
    assert account is not None
    first, second = interleaved(
        writers, lambda: a.stop(account, "cnv_01A", turn_id), lambda: b.stop(account, "cnv_01A", turn_id)
    )
    for outcome in (first, second):
        assert not isinstance(outcome, TalariaError), outcome
        turn, ended = outcome
        assert (turn.state, turn.stop_requested, ended) == ("running", True, None)


def test_two_admins_demoted_at_once_leave_one_the_second_answers_last_admin(writers: Writers) -> None:
    a, b = Accounts(writers.a, writers.clock), Accounts(writers.b, writers.clock)
    with writers.a.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
    for name in ("ada", "bob"):
        a.create(username=name, password=PASSWORD, role="admin")
    first, second = interleaved(
        writers,
        lambda: a.update("ada", "default", {"role": "user"}),
        lambda: b.update("bob", "default", {"enabled": False}),
    )
    assert not isinstance(first, TalariaError), first
    assert isinstance(second, TalariaError) and (second.code, second.status) == ("last_admin", 409), second
    bob = a.get("bob")
    assert bob is not None and (bob.role, bob.enabled) == ("admin", True)


def test_a_job_turn_recorded_or_finished_by_two_writers_keeps_the_first(writers: Writers) -> None:
    a, b = JobTurns(writers.a, writers.clock), JobTurns(writers.b, writers.clock)
    turn = JobTurn(job_id="job_01TEST", tenant="default", attempt=1, runner_id="r1", profile="default",
                   stored_session_id=None, marker="[m]", state="submitting")  # fmt: skip

    def begin(turns: JobTurns) -> TurnMoveRefused | None:
        try:
            turns.begin(turn)
        except TurnMoveRefused as exc:
            return exc
        return None

    made, refused = interleaved(writers, lambda: begin(a), lambda: begin(b))
    assert made is None and isinstance(refused, TurnMoveRefused), (made, refused)
    first, second = interleaved(
        writers,
        lambda: a.finish("job_01TEST", "complete", "the reply", "s1"),
        lambda: b.finish("job_01TEST", "interrupted", None, None),
    )
    assert (first, second) == (None, None)
    recorded = a.get("job_01TEST")
    assert recorded is not None and (recorded.state, recorded.outcome, recorded.reply) == ("finished", "complete",
                                                                                          "the reply")  # fmt: skip


def test_two_reapers_share_the_due_leases_without_waiting_for_each_other(writers: Writers, tmp_path: Path) -> None:
    a, b = (Engine(store, writers.clock, Settings(data_dir=tmp_path)) for store in writers)
    with writers.a.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
    claimed_jobs(a, 3)
    writers.clock.advance(3600)  # every lease is due
    held = HeldAtCommit()
    writers.a.fault_hook = held
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(a.expire_due)
        assert held.reached.wait(20), "the first reaper never reached COMMIT"
        writers.a.fault_hook = None
        second = pool.submit(b.expire_due)
        try:
            # the first still holds its batch: the second skips those rows instead of waiting for them
            assert second.result(20) == 0
        finally:
            held.go.set()
        assert first.result(20) == 3
    with writers.a.read() as tx:
        assert [row["state"] for row in tx.all("job_due", now=writers.clock.now_ms(), limit=10)] == []
