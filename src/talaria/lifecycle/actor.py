"""Who calls the engine: a principal, its roles, and the door it came through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# team and team_tool: team tools' reconciler and tool calls (team-tools.md 4.2, 10)
VIAS = frozenset({"trusted_proxy", "in_process", "web", "cli", "reaper", "recovery", "team", "team_tool"})
RUNTIME = "runtime"
RUNTIME_API = "trusted_proxy"  # the Runtime API's door: blind to in-process-only jobs (team-tools.md 4.3)
PLATFORM_ADMIN = "platform_admin"


@dataclass(frozen=True)
class Actor:
    principal: str
    roles: frozenset[str]
    via: str
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.via not in VIAS:
            raise ValueError(f"unknown via {self.via!r}")

    def has(self, role: str) -> bool:
        return role in self.roles

    @property
    def sees_in_process_jobs(self) -> bool:
        """Every door but the Runtime API's sees jobs only the in-process dispatcher may run (ADR 0039)."""
        return self.via != RUNTIME_API

    def as_json(self) -> dict[str, Any]:
        return {"principal": self.principal, "roles": sorted(self.roles), "via": self.via}


def account_principal(tenant: str, username: str) -> str:
    return f"acct:{tenant}/{username}"


def username_of(principal: str | None) -> str | None:
    """``acct:t/u`` -> ``u``; other principals are returned unchanged."""
    if principal is None:
        return None
    if principal.startswith("acct:") and "/" in principal:
        return principal.split("/", 1)[1]
    return principal
