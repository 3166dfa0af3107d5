"""The hub's validity check of a command (runner-protocol.md 8).

Passes only if the account is enabled, its ``auth_version`` equals the captured value, the runner is
enabled, and the profile involved is in the account's allowed profiles for the runner's source and in
the runner's own list. Reads are primary-key lookups on the local store.
"""

from __future__ import annotations

import json

from talaria.hub.runners.connection_state import AccountRef
from talaria.store.interface import Store


class Validity:
    def __init__(self, store: Store) -> None:
        self.store = store

    def runner_enabled(self, runner_id: str) -> bool:
        with self.store.read() as tx:
            row = tx.one("runner_get", id=runner_id)
        return bool(row and row["enabled"])

    def check(self, account: AccountRef | None, runner_id: str, profile: str | None) -> bool:
        with self.store.read() as tx:
            runner = tx.one("runner_get", id=runner_id)
            row = tx.one("account_get", username=account.username) if account else None
        if runner is None or not runner["enabled"]:
            return False
        if account is None:
            return profile is None
        if row is None or not row["enabled"] or row["tenant"] != runner["tenant"]:
            return False
        if int(row["auth_version"]) != account.auth_version:
            return False
        if profile is None:
            return True
        allowed = json.loads(row["allowed_profiles"]).get(runner["source"], [])
        return profile in allowed and profile in json.loads(runner["allowed_profiles"])

    def intersection(self, username: str, runner_id: str) -> list[str]:
        """Profiles the account may use through this runner, in the runner's order."""
        with self.store.read() as tx:
            runner = tx.one("runner_get", id=runner_id)
            row = tx.one("account_get", username=username)
        if runner is None or row is None:
            return []
        allowed = set(json.loads(row["allowed_profiles"]).get(runner["source"], []))
        return [p for p in json.loads(runner["allowed_profiles"]) if p in allowed]
