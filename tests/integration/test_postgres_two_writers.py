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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from talaria.accounts.service import Account, Accounts
from talaria.chat.bots import Bots
from talaria.chat.conversations import Conversations
from talaria.chat.turn_writes import NewMessage, store_message
from talaria.chat.turns import ChatTurns
from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.runners.registry import RunnerRegistry, parse_registration
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.postgres.store import PostgresStore
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database
from tests.conftest import PASSWORD

pytestmark = pytest.mark.usefixtures("fast_argon2")


@dataclass
class Writers:
    url: str
    a: PostgresStore
    b: PostgresStore
    clock: ManualClock

    def __iter__(self) -> Iterator[PostgresStore]:
        return iter((self.a, self.b))


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


def seed_conversations(store: PostgresStore, *ids: str) -> None:
    """Account ``uma``, her bot, and conversations ``ids``."""
    with store.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
        tx.run("account_insert", username="uma", tenant="default", role="user", password_hash="-",
               allowed_profiles="{}", can_manage_team=0, now=1)  # fmt: skip
        tx.run("bot_insert", id="bot_01TEST", tenant="default", owner="uma", name="Helper", name_key="helper",
               source="local", profile="default", instructions="", now=1)  # fmt: skip
        for conversation in ids:
            tx.run("chat_conversation_insert", id=conversation, tenant="default", owner="uma", bot_id="bot_01TEST",
                   title="t", title_set=0, now=1)  # fmt: skip


def test_messages_stored_concurrently_in_one_conversation_take_the_next_ordinals(writers: Writers) -> None:
    seed_conversations(writers.a, "cnv_01TEST")

    def store(on: PostgresStore, text: str) -> int:
        with on.write() as tx:
            message = NewMessage(role="user", author="uma", content=text)
            return store_message(tx, "cnv_01TEST", message, writers.clock.now_ms()).ordinal

    first, second = interleaved(writers, lambda: store(writers.a, "one"), lambda: store(writers.b, "two"))
    assert (first, second) == (1, 2)


def chat_turns(writers: Writers, store: PostgresStore, tmp_path: Path, **settings: Any) -> ChatTurns:
    def allowed(account: Account, source: str, profile: str) -> bool:
        return True

    key = AuditKey.load(store, tmp_path, writers.clock.now_ms())
    conversations = Conversations(store, writers.clock, allowed)
    return ChatTurns(store, writers.clock, key, allowed, conversations, Settings(data_dir=tmp_path, **settings))


def accept(turns: ChatTurns, conversation_id: str, text: str) -> str:
    account = Accounts(turns.store, turns.clock).get("uma")
    assert account is not None
    body = {"text": text}
    return turns.accept(account, conversation_id, text=text, body=body, key=None).turn.id


@pytest.mark.parametrize(
    ("conversations", "settings", "code"),
    [
        (("cnv_01A", "cnv_01A"), {}, "turn_in_progress"),
        (("cnv_01A", "cnv_01B"), {"chat_per_account": 1}, "chat_turn_limit"),
        (("cnv_01A", "cnv_01B"), {"chat_per_hub": 1}, "chat_busy"),
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
