"""The per-call checks 3-6 of team-tools.md 5 over a real SQLite file: each change that must end a round's tools
(account disabled or its auth_version changed, the bot's permission off, the bot changed, the account's flag off,
the profile no longer allowed, the conversation archived) makes the next check 403 team_tools_forbidden; whoami
answers only what the round captured."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from talaria.accounts.service import Account, Accounts
from talaria.chat.bots import Bot, Bots
from talaria.chat.conversations import Conversations
from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.store import migrations
from talaria.store.interface import Tx
from talaria.store.sqlite import SQLiteStore
from talaria.teams import permission
from talaria.teams.round import USER, Round, check

pytestmark = pytest.mark.usefixtures("fast_argon2")
PASSWORD = "correct horse battery staple"


@dataclass
class Site:
    store: SQLiteStore
    accounts: Accounts
    bots: Bots
    conversations: Conversations
    allowed_pairs: set[tuple[str, str]]
    round: Round

    def allowed(self, account: Account, source: str, profile: str) -> bool:
        return (source, profile) in self.allowed_pairs and profile in account.allowed_profiles.get(source, [])

    def check(self) -> None:
        with self.store.read() as tx:
            check(tx, self.round, self.allowed)

    def refused(self) -> None:
        with pytest.raises(TalariaError) as refused:
            self.check()
        assert (refused.value.code, refused.value.status) == ("team_tools_forbidden", 403)

    def alice(self) -> Account:
        account = self.accounts.get("alice")
        assert account is not None
        return account


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    store = SQLiteStore(tmp_path / "talaria.sqlite3")
    migrations.upgrade(store)
    clock = ManualClock(1_800_000_000_000)
    accounts = Accounts(store, clock)
    pairs = {("local", "default"), ("local", "work")}
    alice = accounts.create(username="alice", password=PASSWORD, role="user", can_manage_team=True,
                            allowed_profiles={"local": ["default", "work"]})  # fmt: skip
    bots = Bots(store, clock, AuditKey(b"k" * 32), lambda a, s, p: True)
    conversations = Conversations(store, clock, lambda a, s, p: True)

    def grant(tx: Tx, bot: Bot, now: int) -> Bot:
        return permission.set_permission(tx, alice, bot, True, now, creating=True)

    lead = bots.create(alice, name="Lead", source="local", profile="default", also=grant)
    conversation = conversations.start(alice, bot_id=lead.id)
    captured = Round(tenant="default", owner="alice", auth_version=alice.auth_version, bot_id=lead.id,
                     bot_revision=lead.revision, conversation_id=conversation.id, turn_id="trn_1", trigger=USER,
                     grant_id="grt_1", runner_id="run_1", source="local", profile="default")  # fmt: skip
    made = Site(store, accounts, bots, conversations, pairs, captured)
    yield made
    store.close()


def test_a_round_whose_world_did_not_change_passes_and_whoami_names_only_the_round(site: Site) -> None:
    site.check()
    assert site.round.whoami() == {"account": "alice", "tenant": "default", "source": "local", "profile": "default",
                                   "workId": site.round.conversation_id, "grantId": "grt_1",
                                   "botId": site.round.bot_id, "turnId": "trn_1"}  # fmt: skip


def test_an_auth_version_changed_ends_the_tools(site: Site) -> None:
    site.accounts.update("alice", "default", {"allowedProfiles": {"local": ["default", "work", "x"]}})
    site.refused()  # a bare auth_version bump: chat.md's strict per-round rule


def test_the_account_disabled_ends_the_tools_even_at_its_new_auth_version(site: Site) -> None:
    site.accounts.update("alice", "default", {"enabled": False})
    site.round = replace(site.round, auth_version=site.alice().auth_version)
    site.refused()


def test_the_account_s_team_flag_off_ends_the_tools(site: Site) -> None:
    site.accounts.update("alice", "default", {"canManageTeam": False})
    site.round = replace(site.round, auth_version=site.alice().auth_version)
    site.refused()  # effective permission needs the flag, whatever the auth_version


def test_the_bot_s_permission_off_ends_the_tools(site: Site) -> None:
    def revoke(tx: Tx, bot: Bot, now: int) -> Bot:
        return permission.set_permission(tx, site.alice(), bot, False, now)

    site.bots.update(site.alice(), site.round.bot_id, also=revoke)
    site.refused()


def test_any_change_of_the_bot_ends_the_tools(site: Site) -> None:
    site.bots.update(site.alice(), site.round.bot_id, instructions="Be brief.")
    site.refused()  # the revision captured at round start no longer holds


def test_the_profile_no_longer_allowed_ends_the_tools(site: Site) -> None:
    site.allowed_pairs.discard(("local", "default"))
    site.refused()


def test_the_conversation_archived_ends_the_tools(site: Site) -> None:
    site.conversations.update(site.alice(), site.round.conversation_id, archived=True)
    site.refused()


def test_another_owner_s_conversation_or_bot_is_refused(site: Site) -> None:
    site.round = replace(site.round, conversation_id="cnv_nosuch")
    site.refused()
    site.round = replace(site.round, owner="bob")
    site.refused()
