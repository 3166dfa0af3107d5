"""Team tools' records as read from their rows, and their views (team-tools.md 6.3): each object's ids and states
before its other keys, goal ``counts`` with non-zero statuses only (Hermes 0.19.0 marks a result failed when its
first 500 characters say ``failed`` or ``error``; a zero count would say it needlessly, 6.1)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from talaria.store.interface import Row


def _ms(value: Any) -> int | None:
    return int(value) if value is not None else None


@dataclass(frozen=True)
class Team:
    id: str
    tenant: str
    owner: str
    name: str
    administrator_id: str
    member_ids: tuple[str, ...]  # the administrator first
    instructions: str
    archived: bool
    revision: int
    created_in_turn_id: str | None
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: Row, members: Iterable[str]) -> Team:
        return cls(
            id=row["id"], tenant=row["tenant"], owner=row["owner"], name=row["name"],
            administrator_id=row["administrator_id"], member_ids=tuple(members), instructions=row["instructions"],
            archived=bool(row["archived"]), revision=int(row["revision"]), created_in_turn_id=row["created_in_turn_id"],
            created_at=int(row["created_at"]), updated_at=int(row["updated_at"]),
        )  # fmt: skip

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id, "administratorId": self.administrator_id, "memberIds": list(self.member_ids),
            "archived": self.archived, "revision": self.revision, "name": self.name,
            "instructions": self.instructions, "createdAt": self.created_at, "updatedAt": self.updated_at,
        }  # fmt: skip


@dataclass(frozen=True)
class Assignment:
    id: str
    goal_id: str
    bot_id: str
    title: str
    brief: str
    acceptance_criteria: tuple[str, ...]
    depends_on: tuple[str, ...]
    status: str
    attempt: int
    max_attempts: int
    result: str | None
    review: str | None
    task_id: str | None
    job_id: str | None
    revision: int
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: Row) -> Assignment:
        return cls(
            id=row["id"], goal_id=row["goal_id"], bot_id=row["bot_id"], title=row["title"], brief=row["brief"],
            acceptance_criteria=tuple(json.loads(row["acceptance_criteria"])),
            depends_on=tuple(json.loads(row["depends_on"])), status=row["status"], attempt=int(row["attempt"]),
            max_attempts=int(row["max_attempts"]), result=row["result"], review=row["review"],
            task_id=row["task_id"], job_id=row["job_id"], revision=int(row["revision"]),
            created_at=int(row["created_at"]), updated_at=int(row["updated_at"]),
        )  # fmt: skip

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id, "goalId": self.goal_id, "botId": self.bot_id, "taskId": self.task_id,
            "jobId": self.job_id, "status": self.status, "attempt": self.attempt, "maxAttempts": self.max_attempts,
            "title": self.title, "brief": self.brief, "acceptanceCriteria": list(self.acceptance_criteria),
            "dependsOn": list(self.depends_on), "result": self.result, "review": self.review,
            "createdAt": self.created_at, "updatedAt": self.updated_at,
        }  # fmt: skip


@dataclass(frozen=True)
class Goal:
    id: str
    tenant: str
    owner: str
    team_id: str
    coordinator_id: str
    title: str
    objective: str
    status: str
    cause: str | None
    acceptance_criteria: tuple[str, ...]
    acceptance_revision: int
    checks: tuple[dict[str, Any], ...]
    result: str | None
    activation: int
    revision: int
    automatic_wakes: int
    origin_conversation_id: str
    origin_turn_id: str
    team_revision: int
    auth_version: int
    last_turn_id: str | None
    finish_turn_id: str | None
    wake_turn_id: str | None
    last_signature: str | None
    stopped_by: str | None
    created_at: int
    updated_at: int
    finished_at: int | None

    @classmethod
    def from_row(cls, row: Row) -> Goal:
        return cls(
            id=row["id"], tenant=row["tenant"], owner=row["owner"], team_id=row["team_id"],
            coordinator_id=row["coordinator_id"], title=row["title"], objective=row["objective"],
            status=row["status"], cause=row["cause"], acceptance_criteria=tuple(json.loads(row["acceptance_criteria"])),
            acceptance_revision=int(row["acceptance_revision"]), checks=tuple(json.loads(row["checks"])),
            result=row["result"], activation=int(row["activation"]), revision=int(row["revision"]),
            automatic_wakes=int(row["automatic_wakes"]), origin_conversation_id=row["origin_conversation_id"],
            origin_turn_id=row["origin_turn_id"], team_revision=int(row["team_revision"]),
            auth_version=int(row["auth_version"]), last_turn_id=row["last_turn_id"],
            finish_turn_id=row["finish_turn_id"], wake_turn_id=row["wake_turn_id"],
            last_signature=row["last_signature"], stopped_by=row["stopped_by"], created_at=int(row["created_at"]),
            updated_at=int(row["updated_at"]), finished_at=_ms(row["finished_at"]),
        )  # fmt: skip

    def view(self, assignments: Iterable[Assignment]) -> dict[str, Any]:
        """The goal view; ``counts`` from ``assignments`` (all of the goal's), non-zero statuses only."""
        counts = Counter(a.status for a in assignments)
        return {
            "id": self.id, "teamId": self.team_id, "coordinatorId": self.coordinator_id, "status": self.status,
            "cause": self.cause, "revision": self.revision, "acceptanceRevision": self.acceptance_revision,
            "activation": self.activation, "title": self.title, "objective": self.objective,
            "acceptanceCriteria": list(self.acceptance_criteria), "checks": list(self.checks), "result": self.result,
            "automaticWakes": self.automatic_wakes,
            "origin": {"conversationId": self.origin_conversation_id, "turnId": self.origin_turn_id},
            "counts": {status: n for status, n in sorted(counts.items()) if n},
            "createdAt": self.created_at, "updatedAt": self.updated_at, "finishedAt": self.finished_at,
        }  # fmt: skip
