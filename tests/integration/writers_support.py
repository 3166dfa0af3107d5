"""Two writers of one PostgreSQL database, as two hub replicas are (scale.md 2.3, 3.7): the stores, and the rows
the chat write-path tests start from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talaria.accounts.service import Account, Accounts
from talaria.chat.conversations import Conversations
from talaria.chat.turns import ChatTurns
from talaria.clock import ManualClock
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.postgres.store import PostgresStore


@dataclass
class Writers:
    url: str
    a: PostgresStore
    b: PostgresStore
    clock: ManualClock

    def __iter__(self) -> Iterator[PostgresStore]:
        return iter((self.a, self.b))


OWNERS = {"uma": "bot_01TEST", "ulf": "bot_01TESTU"}  # account -> its bot


def seed_conversations(store: PostgresStore, *ids: str) -> None:
    """Accounts ``uma`` and ``ulf``, a bot of each, and conversations ``ids`` (``ulf``'s when the id ends in ``U``,
    else ``uma``'s)."""
    with store.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
        for owner, bot_id in OWNERS.items():
            tx.run("account_insert", username=owner, tenant="default", role="user", password_hash="-",
                   allowed_profiles="{}", can_manage_team=0, now=1)  # fmt: skip
            tx.run("bot_insert", id=bot_id, tenant="default", owner=owner, name="Helper", name_key="helper",
                   source="local", profile="default", instructions="", now=1)  # fmt: skip
        for conversation in ids:
            owner = owner_of(conversation)
            tx.run("chat_conversation_insert", id=conversation, tenant="default", owner=owner, bot_id=OWNERS[owner],
                   title="t", title_set=0, now=1)  # fmt: skip


def owner_of(conversation_id: str) -> str:
    return "ulf" if conversation_id.endswith("U") else "uma"


def chat_turns(writers: Writers, store: PostgresStore, tmp_path: Path, **settings: Any) -> ChatTurns:
    def allowed(account: Account, source: str, profile: str) -> bool:
        return True

    key = AuditKey.load(store, tmp_path, writers.clock.now_ms())
    conversations = Conversations(store, writers.clock, allowed)
    return ChatTurns(store, writers.clock, key, allowed, conversations, Settings(data_dir=tmp_path, **settings))


def accept(turns: ChatTurns, conversation_id: str, text: str) -> str:
    account = Accounts(turns.store, turns.clock).get(owner_of(conversation_id))
    assert account is not None
    body = {"text": text}
    return turns.accept(account, conversation_id, text=text, body=body, key=None).turn.id


def claimed_jobs(engine: Engine, n: int, cell: str = "local") -> list[tuple[str, str]]:
    """``n`` jobs of ``cell`` claimed by a worker: (job id, lease id) each."""
    author = Actor("acct:default/alice", frozenset(), "web", "default")
    admin = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", "default")
    worker = Actor("worker-1", frozenset({"runtime"}), "trusted_proxy", "default")
    out = []
    for i in range(n):
        task = engine.create_task(author, tenant="default", title=f"t{i}", spec={"prompt": "hi"}, cell=cell,
                                  profile="default", trace="a" * 32)  # fmt: skip
        engine.submit_task(author, tenant="default", task_id=task.id)
        task, dispatch, job = engine.approve_and_dispatch(admin, tenant="default", task_id=task.id)
        binding = Binding("default", task.id, task.trace, "worker-1", dispatch.provenance, dispatch.run_id,
                          dispatch.id, job.id, cell, "default")  # fmt: skip
        lease = engine.claim(worker, job_id=job.id, binding=binding, worker_instance="w1").answer.lease
        out.append((job.id, lease.lease_id))
    return out
