"""What a restore means (operations.md 7.2): the marker ``db restore`` (SQLite) or ``db mark-restored``
(PostgreSQL) writes, and the steps the first hub start after it takes before recovery's expiry step and before the
listener opens.

| step | what | skipped with ``--resume-unfinished`` |
|---|---|---|
| 1 | every web session ends; no conversation resumes its Hermes session, nor a goal member its kept one | no |
| 2 | the runners' operational state goes (PostgreSQL; on SQLite it lived in the stopped process): new epochs | no |
| 3 | every job not terminal: an admin cancel by the recovery actor, reason ``restored_from_backup`` | yes |
| 4 | every chat turn ``queued`` or ``pending`` ends ``uncertain`` ``restored_from_backup`` | yes |
| 5 | every running, reviewed or waiting team goal stops (G6, cause ``restored_from_backup``) | yes |

Each step is conditional (a deleted row, an ended turn, a cancelled job is left as it is), so a start interrupted
half-way repeats them; the marker is removed only after all committed. On PostgreSQL every replica checks for the
marker holding the migration lock, before its dispatcher, reaper or listener starts, so one applies it and the others
find it gone. A job, turn or goal may have run after the backup point; Talaria never runs one twice on a guess
(DESIGN principle 3), and the ``--resume-unfinished`` choice is the operator's.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from talaria.chat.turn_writes import end_turn, lock_turn
from talaria.clock import Clock
from talaria.lifecycle.audit_key import FILE_NAME as AUDIT_KEY_NAME
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.recovery import recovery_actor
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Row, Store, Tx
from talaria.teams import member_sessions
from talaria.teams import reads as team_reads
from talaria.teams.machine import STOPPABLE_GOAL
from talaria.teams.steps import cancel_goal

log = structlog.get_logger("talaria.hub")

RESTORED: Final = "restored_from_backup"
TURN_ERROR: Final = (
    "the hub was restored from a backup; this turn may have run after the backup point, so it is not sent again"
)
WAITING_TURNS: Final = ("queued", "pending")
# scale.md 3.1's tables, children first (DELETE, not TRUNCATE: an application role may lack that privilege)
OPERATIONAL_DROPS: Final = (
    "runner_conn_drop_events", "runner_conn_drop_tool_calls", "runner_conn_drop_gateways", "runner_conn_drop_grants",
    "runner_conn_drop_commands", "runner_conn_drop_retired", "runner_conn_drop_all",
)  # fmt: skip
# db restore renames the backup's audit key to audit.key just after the database; a restore interrupted between the
# two renames leaves it under this name, and the start finishes the rename (SQLite)
KEY_IN_FLIGHT: Final = "audit.key.restoring"


@dataclass(frozen=True)
class Marker:
    restored_at: int
    source: str
    resume_unfinished: bool
    audit_key_sha256: str | None = None


@dataclass(frozen=True)
class Unfinished:
    """What a restored database holds that the first start would end (or, resumed, leave to go on)."""

    jobs: int
    turns: int
    goals: int


@dataclass(frozen=True)
class Applied:
    sessions: int
    jobs: int
    turns: int
    goals: int
    resumed: bool


def marker(store: Store) -> Marker | None:
    with store.read() as tx:
        row = tx.one("restore_marker_get")
    if row is None:
        return None
    digest = row["audit_key_sha256"]
    return Marker(int(row["restored_at"]), str(row["source"]), bool(row["resume_unfinished"]), digest)


def _teams(store: Store) -> bool:
    return migrations.current(store).get("team", 0) > 0


def _stoppable_goals(tx: Tx) -> list[Row]:
    return [row for row in tx.all("goal_open_all") if row["status"] in STOPPABLE_GOAL]


def unfinished(store: Store) -> Unfinished:
    teams = _teams(store)
    with store.read() as tx:
        return Unfinished(
            jobs=len(tx.all("job_unended")),
            turns=len(tx.all("chat_turn_waiting_all")),
            goals=len(_stoppable_goals(tx)) if teams else 0,
        )


def mark(
    store: Store, *, source: str, resume_unfinished: bool, now_ms: int, audit_key_sha256: str | None = None
) -> Unfinished:
    """Write the marker (replacing one not yet applied) into a migrated database; returns what the start will end."""
    with store.write() as tx:
        tx.run("restore_marker_put", now=now_ms, source=source, audit_key_sha256=audit_key_sha256,
               resume_unfinished=int(resume_unfinished))  # fmt: skip
    return unfinished(store)


def apply(store: Store, engine: Engine, settings: Settings, clock: Clock) -> Applied | None:
    """The start steps of the module docstring when a marker is present (under the migration lock); None without
    one. Runs before ``Engine.recover``."""
    with store.migrating():
        found = marker(store)
        if found is None:
            return None
        log.info("restore_start", restored_at=found.restored_at, resume_unfinished=found.resume_unfinished)
        if store.dialect == "sqlite" and found.audit_key_sha256 is not None:
            _finish_key_rename(Path(settings.data_dir), found.audit_key_sha256)
        teams = _teams(store)
        now = clock.now_ms()
        with store.write() as tx:
            sessions = tx.run("session_delete_all")
            tx.run("chat_conversation_unreuse_all")
            if teams:
                member_sessions.retire_all(tx, now)
            if store.dialect == "postgresql":
                for query in OPERATIONAL_DROPS:
                    tx.run(query)
        jobs = turns = goals = 0
        if not found.resume_unfinished:
            jobs = engine.cancel_unended(RESTORED)
            turns = _end_waiting_turns(store, settings, clock)
            goals = _stop_goals(store, settings, clock) if teams else 0
        with store.write() as tx:
            tx.run("restore_marker_delete")
    applied = Applied(sessions, jobs, turns, goals, found.resume_unfinished)
    log.info("restore_applied", sessions=sessions, jobs=jobs, turns=turns, goals=goals, resumed=applied.resumed)
    return applied


def _finish_key_rename(data_dir: Path, digest: str) -> None:
    """The backup's key left in flight by an interrupted ``db restore`` becomes ``audit.key`` (only that key)."""
    in_flight = data_dir / KEY_IN_FLIGHT
    if in_flight.is_file() and hashlib.sha256(in_flight.read_bytes()).hexdigest() == digest:
        os.replace(in_flight, data_dir / AUDIT_KEY_NAME)
        log.warning("restore_audit_key_put_in_place")


def _end_waiting_turns(store: Store, settings: Settings, clock: Clock) -> int:
    key = AuditKey.load(store, Path(settings.data_dir), clock.now_ms())
    with store.read() as tx:
        waiting = [row["id"] for row in tx.all("chat_turn_waiting_all")]
    ended = 0
    for turn_id in waiting:
        with store.write() as tx:
            turn = lock_turn(tx, turn_id)  # ending a pending turn promotes the next queued one, ended in its turn
            if turn.state not in WAITING_TURNS:
                continue
            end_turn(tx, turn, state="uncertain", code=RESTORED, error=TURN_ERROR,
                     actor=recovery_actor(settings, turn.tenant), key=key, now_ms=clock.now_ms())  # fmt: skip
            ended += 1
    return ended


def _stop_goals(store: Store, settings: Settings, clock: Clock) -> int:
    with store.read() as tx:
        ids = [row["id"] for row in _stoppable_goals(tx)]
    stopped = 0
    for goal_id in ids:
        with store.write() as tx:
            goal = team_reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status not in STOPPABLE_GOAL:
                continue
            cancel_goal(tx, goal, RESTORED, recovery_actor(settings, goal.tenant), clock.now_ms())
            stopped += 1
    return stopped
