"""Account operations over the store. Any change of enablement, role, permissions or password
bumps ``auth_version``; disabling, a role change or a new password also ends the account's sessions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from talaria.accounts.passwords import hash_password
from talaria.accounts.rules import check_allowed_profiles, check_password, check_role, check_username
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.store.interface import Row, Store


@dataclass(frozen=True)
class Account:
    username: str
    tenant: str
    role: str
    enabled: bool
    allowed_profiles: dict[str, list[str]]
    can_manage_team: bool
    auth_version: int
    created_at: int

    @classmethod
    def from_row(cls, row: Row) -> Account:
        return cls(
            username=row["username"],
            tenant=row["tenant"],
            role=row["role"],
            enabled=bool(row["enabled"]),
            allowed_profiles=json.loads(row["allowed_profiles"]),
            can_manage_team=bool(row["can_manage_team"]),
            auth_version=int(row["auth_version"]),
            created_at=int(row["created_at"]),
        )

    @property
    def principal(self) -> str:
        return f"acct:{self.tenant}/{self.username}"

    def as_json(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "tenant": self.tenant,
            "role": self.role,
            "enabled": self.enabled,
            "allowedProfiles": self.allowed_profiles,
            "canManageTeam": self.can_manage_team,
            "authVersion": self.auth_version,
            "createdAt": self.created_at,
        }


class Accounts:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def create(
        self,
        *,
        username: str,
        password: str,
        role: str,
        tenant: str = "default",
        allowed_profiles: dict[str, list[str]] | None = None,
        can_manage_team: bool = False,
    ) -> Account:
        """Raises ``account_exists`` (409), ``weak_password`` or ``invalid_request`` (400)."""
        check_username(username)
        check_role(role)
        check_password(password)
        profiles = check_allowed_profiles(allowed_profiles or {})
        password_hash = hash_password(password)  # slow: outside the write transaction
        with self.store.write() as tx:
            now = self.clock.now_ms()
            if tx.one("account_get", username=username) is not None:
                raise TalariaError("account_exists", f"an account named {username} already exists")
            tx.run("tenant_ensure", name=tenant, now=now)
            made = tx.one(
                "account_insert",
                username=username,
                tenant=tenant,
                role=role,
                password_hash=password_hash,
                allowed_profiles=json.dumps(profiles, sort_keys=True),
                can_manage_team=int(can_manage_team),
                now=now,
            )
            if made is None:  # created meanwhile by another hub replica
                raise TalariaError("account_exists", f"an account named {username} already exists")
            row = tx.one("account_get", username=username)
        assert row is not None
        return Account.from_row(row)

    def get(self, username: str) -> Account | None:
        with self.store.read() as tx:
            row = tx.one("account_get", username=username)
        return Account.from_row(row) if row else None

    def password_hash(self, username: str) -> str | None:
        with self.store.read() as tx:
            row = tx.one("account_get", username=username)
        return str(row["password_hash"]) if row else None

    def credentials(self, username: str) -> tuple[Account, str] | None:
        """The account and its password hash, read together: a session made after checking that hash is made
        for this ``auth_version`` only (``WebSessions.create``)."""
        with self.store.read() as tx:
            row = tx.one("account_get", username=username)
        return (Account.from_row(row), str(row["password_hash"])) if row else None

    def list(self, tenant: str, *, limit: int, cursor: tuple[int, str] | None) -> list[Account]:
        with self.store.read() as tx:
            rows = tx.all(
                "account_list",
                tenant=tenant,
                cursor_at=cursor[0] if cursor else None,
                cursor_id=cursor[1] if cursor else None,
                limit=limit,
            )
        return [Account.from_row(r) for r in rows]

    def update(
        self, username: str, tenant: str, changes: dict[str, Any], *, keep_session_hash: str | None = None
    ) -> Account:
        """Apply ``changes`` (password, role, enabled, allowedProfiles, canManageTeam); 404 if absent. A change of
        password, role or enablement ends the account's sessions, all but ``keep_session_hash`` if given."""
        new_hash = hash_password(check_password(changes["password"])) if "password" in changes else None
        with self.store.write() as tx:
            tx.run("tenant_lock", name=tenant)  # first: the last-admin rule counts the tenant's other admins
            row = tx.one("account_get", username=username)
            if row is None or row["tenant"] != tenant:
                raise TalariaError("not_found", "no such account")
            current = Account.from_row(row)
            role = check_role(changes.get("role", current.role))
            enabled = bool(changes.get("enabled", current.enabled))
            profiles = check_allowed_profiles(changes.get("allowedProfiles", current.allowed_profiles))
            team = bool(changes.get("canManageTeam", current.can_manage_team))
            leaves = current.role == "admin" and current.enabled and (role != "admin" or not enabled)
            others = tx.one("account_count_other_enabled_admins", tenant=tenant, username=username) if leaves else None
            if others is not None and not others["n"]:
                raise TalariaError("last_admin", "the tenant's last enabled admin cannot be disabled or demoted")
            if new_hash is None and (role, enabled, profiles, team) == (
                current.role,
                current.enabled,
                current.allowed_profiles,
                current.can_manage_team,
            ):
                return current  # nothing changed: authVersion stays
            changed = tx.run(
                "account_update",
                username=username,
                role=role,
                password_hash=new_hash or row["password_hash"],
                enabled=int(enabled),
                allowed_profiles=json.dumps(profiles, sort_keys=True),
                can_manage_team=int(team),
                auth_version=current.auth_version + 1,
                expected_auth_version=current.auth_version,
                now=self.clock.now_ms(),
            )
            if changed != 1:
                raise TalariaError("invalid_transition", "the account changed meanwhile; read it again")
            if (new_hash or role != current.role or not enabled) and keep_session_hash is None:
                tx.run("session_delete_for_user", username=username)
            elif new_hash or role != current.role or not enabled:
                tx.run("session_delete_for_user_but", username=username, kept=keep_session_hash)
            updated = tx.one("account_get", username=username)
        assert updated is not None
        return Account.from_row(updated)
