"""Approval by policy (team-tools.md 4.2, 4.3) over a real SQLite file: ``dispatch_by_policy`` creates, submits,
approves and dispatches one task in the caller's transaction with the usual events and their actors, rolls it all
back when its verification refuses, and its job is invisible to the Runtime API's door (discovery in every state;
a call naming it is ``job_not_found`` exactly as an unknown job, writing nothing) while the in-process dispatcher
claims it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.context import Signals
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.policy import PolicyTask, dispatch_by_policy
from talaria.lifecycle.records import Job
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Tx
from talaria.store.sqlite import SQLiteStore
from tests.conftest import db_rows

TENANT = "default"
RUNTIME = Actor("worker-a", frozenset({"runtime"}), "trusted_proxy", TENANT)
RUNTIME_ADMIN = Actor("admin-1", frozenset({"platform_admin", "runtime"}), "trusted_proxy", TENANT)
IN_PROCESS = Actor("talaria-dispatcher", frozenset({"runtime"}), "in_process", TENANT)
SPEC = {"prompt": "[talaria-assignment]\nassignmentId: asg_1", "team": {"assignmentId": "asg_1", "attempt": 1},
        "approval": {"policy": "team_permission", "coordinatorBotId": "bot_lead", "grantedBy": "alice"}}  # fmt: skip


@dataclass
class Site:
    engine: Engine
    store: SQLiteStore
    path: Path
    signalled: list[tuple[str, str]]

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return db_rows(self.path, sql)

    def dispatch(self, verify: Any = lambda tx: None) -> Job:
        signals: Signals = []
        task = PolicyTask(
            tenant=TENANT, owner="alice", policy="team_permission", approver="bot_lead", title="Assignment: Draft",
            spec=SPEC, cell="local", profile="work", trace="0" * 32,
        )  # fmt: skip
        with self.store.write() as tx:
            _, _, job = dispatch_by_policy(self.engine.settings, tx, 1_000, task, signals, verify)
        self.engine.emit(signals)
        return job


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    settings = Settings(data_dir=tmp_path, approval_allow_self_approval=False)
    store = SQLiteStore(settings.sqlite_path)
    migrations.upgrade(store)
    engine = Engine(store, ManualClock(1_000), settings)
    with store.write() as tx:
        tx.run("tenant_ensure", name=TENANT, now=1_000)
    signalled: list[tuple[str, str]] = []
    engine.add_listener(lambda signal, job_id: signalled.append((signal, job_id)))
    yield Site(engine, store, settings.sqlite_path, signalled)
    store.close()


def test_one_transaction_creates_submits_approves_and_dispatches_with_the_policy_s_actors(site: Site) -> None:
    job = site.dispatch()
    assert site.signalled == [("enqueued", job.id)]
    events = site.rows(
        "SELECT type, body FROM audit_event WHERE type LIKE 'task.%' OR type LIKE 'hermes.%' ORDER BY seq"
    )
    shown = [(e["type"], json.loads(e["body"])["actor"]["principal"], json.loads(e["body"])["actor"]["via"],
              json.loads(e["body"])["reason_code"]) for e in events]  # fmt: skip
    assert shown == [
        ("task.created", "acct:default/alice", "team", None),
        ("task.submitted", "acct:default/alice", "team", None),
        ("task.approved", "policy:team_permission:bot_lead", "team", "policy:team_permission"),
        ("task.dispatched", site.engine.settings.lifecycle_dispatcher_principal, "team", None),
        ("hermes.job.enqueued", site.engine.settings.lifecycle_dispatcher_principal, "team", None),
    ]
    [task] = site.rows("SELECT * FROM task")
    assert (task["state"], task["created_by"], task["approved_by"]) == (
        "DISPATCHED", "acct:default/alice", "policy:team_permission:bot_lead")  # fmt: skip
    assert json.loads(task["spec"]) == SPEC and task["provenance"] is not None
    assert site.rows("SELECT kind FROM execution_evidence") == [{"kind": "enqueue"}]
    assert site.engine.verify_audit().ok


def test_a_refused_verification_leaves_no_task_and_no_event(site: Site) -> None:
    def refuse(tx: Tx) -> None:
        raise TalariaError("invalid_transition", "the goal's authority no longer holds")

    before = site.rows("SELECT COUNT(*) AS n FROM audit_event")
    with pytest.raises(TalariaError):
        site.dispatch(refuse)
    assert site.rows("SELECT COUNT(*) AS n FROM task") == [{"n": 0}]
    assert site.rows("SELECT COUNT(*) AS n FROM audit_event") == before and site.signalled == []


def test_the_runtime_api_cannot_discover_or_name_the_job_and_the_dispatcher_claims_it(site: Site) -> None:
    job = site.dispatch()
    binding = job.binding(RUNTIME.principal)
    assert site.engine.discover(RUNTIME, tenant=TENANT, cell="local", profile="work").jobs == ()
    for state in ("QUEUED", "LEASED", "RUNNING"):
        assert site.engine.discover(RUNTIME_ADMIN, tenant=TENANT, cell="local", profile="work", state=state).jobs == ()
    before = site.rows("SELECT * FROM hermes_job")
    events = site.rows("SELECT COUNT(*) AS n FROM audit_event")
    for call in (
        lambda: site.engine.claim(RUNTIME, job_id=job.id, binding=binding, worker_instance="w-1"),
        lambda: site.engine.status(RUNTIME, job_id=job.id, binding=binding),
    ):
        with pytest.raises(TalariaError) as refusal:
            call()
        assert (refusal.value.code, refusal.value.message) == ("job_not_found", "no such job")
    assert site.rows("SELECT * FROM hermes_job") == before
    assert site.rows("SELECT COUNT(*) AS n FROM audit_event") == events
    found = site.engine.discover(IN_PROCESS, tenant=TENANT, cell="local", profile="work").jobs
    assert [d.binding.job for d in found] == [job.id]
    claimed = site.engine.claim(IN_PROCESS, job_id=job.id, binding=job.binding(IN_PROCESS.principal),
                                worker_instance="hub-1")  # fmt: skip
    assert claimed.answer.state == "LEASED"
