"""A goal member's Hermes session across its assignment attempts (team-tools.md 4.3 "Member session").

An assignment job's task spec names its goal and member (``spec.team``). Before the prompt, the dispatcher resumes
the member's kept session when it is ``usable`` and on the runner serving the source now; else it opens a new one.
An attempt that ends with a reply taken from Hermes keeps its session (its stored id, which compression may have
moved); any other end retires it, since Hermes would merge an orphan prompt into the next one (hermes.md 11).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from talaria.store.interface import Store, Tx


@dataclass(frozen=True)
class Member:
    goal_id: str
    bot_id: str


def of_spec(spec: str) -> Member | None:
    """The goal and member of an assignment job's task spec; None for any other job."""
    team = json.loads(spec).get("team")
    if not isinstance(team, dict) or not isinstance(team.get("goalId"), str):
        return None
    return Member(team["goalId"], str(team["memberBotId"]))


def resumable(store: Store, member: Member, runner_id: str) -> str | None:
    """The stored session id to resume, if the member's session is usable on ``runner_id``."""
    with store.read() as tx:
        row = tx.one("member_session_get", goal_id=member.goal_id, bot_id=member.bot_id)
    if row is None or row["state"] != "usable" or row["runner_id"] != runner_id:
        return None
    return str(row["stored_session_id"])


def keep(store: Store, member: Member, runner_id: str, stored_session_id: str, now_ms: int) -> None:
    with store.write() as tx:
        tx.run("member_session_keep", goal_id=member.goal_id, bot_id=member.bot_id, runner_id=runner_id,
               stored_session_id=stored_session_id, now=now_ms)  # fmt: skip


def retire(store: Store, member: Member, now_ms: int) -> None:
    with store.write() as tx:
        tx.run("member_session_retire", goal_id=member.goal_id, bot_id=member.bot_id, now=now_ms)


def retire_all(tx: Tx, now_ms: int) -> None:
    """A restore (operations.md 7.2): the node may hold turns of a kept session after the backup point, so no member
    resumes one; each next attempt opens a new session."""
    tx.run("member_session_retire_all", now=now_ms)
