"""Which (source, profile) pairs an account may bind a bot to (chat.md 3.2; runner-protocol.md 8's hub-side
intersection): the source has an enabled runner record, and the profile is in both that record's
``allowedProfiles`` and the account's ``allowedProfiles[source]``. A pair is *online* while its runner has a
connection state."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.accounts.service import Account
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.runners.transport import RunnerTransport


@dataclass(frozen=True)
class BotProfile:
    source: str
    profile: str
    online: bool


class BotAccess:
    def __init__(self, registry: RunnerRegistry, runners: RunnerTransport) -> None:
        self.registry = registry
        self.runners = runners

    def runner_of(self, tenant: str, source: str) -> RunnerRecord | None:
        return self.registry.for_source(tenant, source)

    def online(self, record: RunnerRecord | None) -> bool:
        return record is not None and self.runners.is_connected(record.id)

    def allowed(self, account: Account, source: str, profile: str) -> bool:
        if not account.enabled or profile not in account.allowed_profiles.get(source, []):
            return False
        record = self.runner_of(account.tenant, source)
        return record is not None and profile in record.allowed_profiles

    def pairs(self, account: Account) -> list[tuple[str, str]]:
        """Every (source, profile) the account may use now (team tools' intersection, team-tools.md 6.3)."""
        return [(p.source, p.profile) for p in self.profiles(account)]

    def profiles(self, account: Account) -> list[BotProfile]:
        """Every pair the account may use now, by source, then profile."""
        out = []
        for source, mine in sorted(account.allowed_profiles.items()):
            record = self.runner_of(account.tenant, source)
            if record is None:
                continue
            online = self.online(record)
            out += [BotProfile(source, p, online) for p in sorted(set(mine) & set(record.allowed_profiles))]
        return out
