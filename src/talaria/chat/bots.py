"""Bots (chat.md 2 and 3.1-3.2): an account's records, each bound at creation to one (source, profile), with a name
and instructions.

Reads and writes are keyed by (tenant, owner, id): another account's bot, an admin's included, is ``not_found``.
Each change is one write transaction with its audit event (chat.md 8): ``chat.bot.created`` and
``chat.bot.updated`` carry the audit-key digest of the name and instructions, never the text;
``chat.bot.archived`` and ``chat.bot.unarchived`` move the bot between ``open`` and ``archived``.

Checks, in order (chat.md 3.2): the name's syntax and the instructions' length (400 ``invalid_request``); the
(source, profile) allowed to the owner now (403 ``bot_not_allowed``); the name free among the owner's bots that are
not archived (409 ``duplicate_bot_name``); at most ``MAX_LIVE_BOTS`` of those (409 ``bot_limit``). Unarchiving
checks the last three again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from talaria.accounts.service import Account
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import MAX_BOT_INSTRUCTIONS_CHARS, MAX_BOT_NAME_CHARS, MAX_LIVE_BOTS
from talaria.store.interface import Row, Store, Tx
from talaria.text_rules import TextRefused, is_control, one_line

OPEN: Final = "open"
ARCHIVED: Final = "archived"

# Whether ``account`` may use ``profile`` on ``source`` now (runner-protocol.md 8: the hub-side intersection).
Allowed = Callable[[Account, str, str], bool]
# More of a bot's change, in its write transaction (team tools' permission beside the bot, team-tools.md 3.1):
# called with the transaction, the bot as written and the time; answers the bot as it is after.
Also = Callable[[Tx, "Bot", int], "Bot"]


@dataclass(frozen=True)
class Bot:
    id: str
    tenant: str
    owner: str
    name: str
    source: str
    profile: str
    instructions: str
    archived: bool
    revision: int
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: Row) -> Bot:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            owner=row["owner"],
            name=row["name"],
            source=row["source"],
            profile=row["profile"],
            instructions=row["instructions"],
            archived=bool(row["archived"]),
            revision=int(row["revision"]),
            created_at=int(row["created_at"]),
            updated_at=int(row["updated_at"]),
        )


def owner_actor(account: Account) -> Actor:
    """Who a chat change is by in the audit log: the owner, through the web (chat.md 8)."""
    return Actor(account.principal, frozenset(), "web", account.tenant)


def require_allowed(allowed: Allowed, account: Account, source: str, profile: str) -> None:
    """403 ``bot_not_allowed`` unless ``account`` may use ``profile`` on ``source`` now."""
    if not allowed(account, source, profile):
        raise TalariaError("bot_not_allowed", "you may not use this profile on this source now")


def name_key(name: str) -> str:
    return name.casefold()


def check_name(value: str) -> str:
    """The bot name trimmed: 1-100 characters, no control character, bidi control or ``@``."""
    try:
        name = one_line("name", value)
    except TextRefused as exc:
        raise TalariaError("invalid_request", str(exc)) from None
    if len(name) > MAX_BOT_NAME_CHARS:
        raise TalariaError("invalid_request", f"name must be at most {MAX_BOT_NAME_CHARS} characters")
    if "@" in name:
        raise TalariaError("invalid_request", "name must not contain @")
    return name


def check_instructions(value: str) -> str:
    """0-24,000 characters, kept as written; of the controls only ``\\n`` and ``\\t``."""
    if len(value) > MAX_BOT_INSTRUCTIONS_CHARS:
        raise TalariaError("invalid_request", f"instructions must be at most {MAX_BOT_INSTRUCTIONS_CHARS} characters")
    for ch in value:
        if is_control(ch) and ch not in "\n\t":
            raise TalariaError(
                "invalid_request", f"instructions must not contain a control character (U+{ord(ch):04X})"
            )
    return value


# --- writes inside the caller's transaction (chat's routes here, team tools in talaria.teams) -------------------


def get(tx: Tx, tenant: str, owner: str, bot_id: str) -> Bot | None:
    row = tx.one("bot_get", tenant=tenant, owner=owner, id=bot_id)
    return Bot.from_row(row) if row is not None else None


def require_free(tx: Tx, tenant: str, owner: str, name: str, bot_id: str, *, counted_live: bool) -> None:
    """The name free among the owner's live bots (409 ``duplicate_bot_name``), and room for one more (409
    ``bot_limit``; ``counted_live``: the bot is already one of them, a rename). The owner's row is held first, so
    concurrent writers (other replicas) count after each other (scale.md 3.7)."""
    tx.run("account_lock", username=owner)
    taken = tx.one("bot_name_taken", tenant=tenant, owner=owner, name_key=name_key(name), id=bot_id)
    if taken is not None:
        raise TalariaError("duplicate_bot_name", "you already have a bot of this name")
    live = tx.one("bot_live_count", tenant=tenant, owner=owner)
    count = int(live["n"]) if live else 0
    if count - int(counted_live) >= MAX_LIVE_BOTS:
        raise TalariaError("bot_limit", f"you have {MAX_LIVE_BOTS} bots; archive one first")


def insert(tx: Tx, *, tenant: str, owner: str, name: str, source: str, profile: str, instructions: str,
           now_ms: int) -> Bot:  # fmt: skip
    """A new bot of checked ``name`` and ``instructions`` (the caller checked its source and profile), after the
    name and count rules; no audit event (the caller's)."""
    bot_id = mint("bot", now_ms)
    require_free(tx, tenant, owner, name, bot_id, counted_live=False)
    tx.run("bot_insert", id=bot_id, tenant=tenant, owner=owner, name=name, name_key=name_key(name), source=source,
           profile=profile, instructions=instructions, now=now_ms)  # fmt: skip
    made = get(tx, tenant, owner, bot_id)
    assert made is not None
    return made


def rewrite(tx: Tx, bot: Bot, *, name: str, instructions: str, archived: bool, now_ms: int) -> Bot:
    """``bot`` (as read in this transaction) with checked ``name``, ``instructions`` and ``archived``, revision +1,
    after the name and count rules when it stays or becomes live under a new name; no audit event."""
    if not archived and (bot.archived or name_key(name) != name_key(bot.name)):
        require_free(tx, bot.tenant, bot.owner, name, bot.id, counted_live=not bot.archived)
    changed = tx.run(
        "bot_update", id=bot.id, expected_revision=bot.revision, name=name, name_key=name_key(name),
        instructions=instructions, archived=int(archived), now=now_ms,
    )  # fmt: skip
    if changed != 1:
        raise TalariaError("store_unavailable", "the bot changed meanwhile; try again")
    after = get(tx, bot.tenant, bot.owner, bot.id)
    assert after is not None
    return after


class Bots:
    def __init__(self, store: Store, clock: Clock, key: AuditKey, allowed: Allowed) -> None:
        self.store = store
        self.clock = clock
        self.key = key
        self.allowed = allowed

    # --- reads ---------------------------------------------------------------------------------------------------

    def get(self, account: Account, bot_id: str) -> Bot:
        with self.store.read() as tx:
            return self._get(tx, account, bot_id)

    def owner_of(self, tenant: str, bot_id: str) -> str | None:
        """The username owning the tenant's bot ``bot_id``, if there is one (any account's: callers decide)."""
        with self.store.read() as tx:
            row = tx.one("bot_owner", tenant=tenant, id=bot_id)
        return str(row["owner"]) if row is not None else None

    def list(self, account: Account, *, archived: bool, after: tuple[int, str] | None, limit: int) -> list[Bot]:
        """A page of the account's bots, newest first (ties by id)."""
        with self.store.read() as tx:
            rows = tx.all(
                "bot_list", tenant=account.tenant, owner=account.username, archived=int(archived), limit=limit,
                cursor_at=after[0] if after else None, cursor_id=after[1] if after else None,
            )  # fmt: skip
        return [Bot.from_row(row) for row in rows]

    # --- writes --------------------------------------------------------------------------------------------------

    def create(
        self,
        account: Account,
        *,
        name: str,
        source: str,
        profile: str,
        instructions: str = "",
        also: Also | None = None,
    ) -> Bot:
        name, instructions = check_name(name), check_instructions(instructions)
        require_allowed(self.allowed, account, source, profile)
        now = self.clock.now_ms()
        with self.store.write() as tx:
            bot = insert(tx, tenant=account.tenant, owner=account.username, name=name, source=source, profile=profile,
                         instructions=instructions, now_ms=now)  # fmt: skip
            self._audit(tx, account, bot, "chat.bot.created", None, OPEN, evidence=True)
            if also is not None:
                bot = also(tx, bot, now)
        return bot

    def update(
        self,
        account: Account,
        bot_id: str,
        *,
        name: str | None = None,
        instructions: str | None = None,
        archived: bool | None = None,
        also: Also | None = None,
    ) -> Bot:
        """Rename, re-instruct, archive or unarchive, then ``also`` in the same transaction; a change to nothing
        changes nothing (no revision, no event)."""
        name = check_name(name) if name is not None else None
        instructions = check_instructions(instructions) if instructions is not None else None
        with self.store.read() as tx:
            before = self._get(tx, account, bot_id)
        if archived is False and before.archived:  # unarchiving: allowed still, outside the write transaction
            require_allowed(self.allowed, account, before.source, before.profile)
        now = self.clock.now_ms()
        with self.store.write() as tx:
            bot = self._get(tx, account, bot_id)
            new_name = bot.name if name is None else name
            new_instructions = bot.instructions if instructions is None else instructions
            new_archived = bot.archived if archived is None else archived
            texts_changed = (new_name, new_instructions) != (bot.name, bot.instructions)
            if not texts_changed and new_archived == bot.archived:
                return also(tx, bot, now) if also is not None else bot
            after = rewrite(tx, bot, name=new_name, instructions=new_instructions, archived=new_archived, now_ms=now)
            if texts_changed:
                state = ARCHIVED if bot.archived else OPEN
                self._audit(tx, account, after, "chat.bot.updated", state, state, evidence=True)
            if new_archived != bot.archived:
                kind = "chat.bot.archived" if new_archived else "chat.bot.unarchived"
                moved = (OPEN, ARCHIVED) if new_archived else (ARCHIVED, OPEN)
                self._audit(tx, account, after, kind, *moved, evidence=False)
            if also is not None:
                after = also(tx, after, now)
        return after

    # --- rules ---------------------------------------------------------------------------------------------------

    def _get(self, tx: Tx, account: Account, bot_id: str) -> Bot:
        bot = get(tx, account.tenant, account.username, bot_id)
        if bot is None:
            raise TalariaError("not_found", "no such bot")
        return bot

    def _audit(
        self, tx: Tx, account: Account, bot: Bot, kind: str, from_state: str | None, to_state: str, *, evidence: bool
    ) -> None:
        texts: dict[str, Any] = {"instructions": bot.instructions, "name": bot.name}
        audit.append(
            tx,
            now_ms=self.clock.now_ms(),
            type=kind,
            tenant=account.tenant,
            actor=owner_actor(account),
            subject=audit.Subject(bot=bot.id),
            from_state=from_state,
            to_state=to_state,
            revision_after=bot.revision,
            evidence=audit.Evidence("chat_bot", self.key.digest(texts)) if evidence else None,
        )
