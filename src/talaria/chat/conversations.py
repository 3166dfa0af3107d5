"""Conversations (chat.md 2 and 3.1-3.2): one account's chat with one of its bots, private to it (admins included).

Reads and writes are keyed by (tenant, owner, id): another account's conversation is ``not_found``. A
conversation's bot never changes. Starting one checks, in order: the bot is the owner's (404), not archived (409
``bot_archived``), still allowed to the owner (403 ``bot_not_allowed``), and the owner has fewer than
``MAX_LIVE_CONVERSATIONS`` conversations that are not archived (409 ``conversation_limit``; unarchiving checks it
again, and the bot). The title is 1-200 characters (a one-line field), ``Untitled chat`` until set.

Audit (chat.md 8): ``chat.conversation.created``, ``.archived`` and ``.unarchived`` with the subject
``{conversation, turn: null}``, moving ``open`` to ``archived`` and back; title changes write none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from talaria.accounts.service import Account
from talaria.chat.bots import ARCHIVED, OPEN, Allowed, owner_actor, require_allowed
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.limits import MAX_CONVERSATION_TITLE_CHARS, MAX_LIVE_CONVERSATIONS
from talaria.store.interface import Row, Store, Tx
from talaria.text_rules import TextRefused, one_line

DEFAULT_TITLE: Final = "Untitled chat"


@dataclass(frozen=True)
class BotRef:
    id: str
    name: str
    source: str
    profile: str
    archived: bool


@dataclass(frozen=True)
class Conversation:
    id: str
    tenant: str
    owner: str
    bot: BotRef
    title: str
    title_set: bool
    archived: bool
    runner_id: str | None
    hermes_session_id: str | None
    created_at: int
    updated_at: int
    last_activity_at: int
    message_count: int
    live_turn_id: str | None
    session_reusable: bool

    @classmethod
    def from_row(cls, row: Row) -> Conversation:
        bot = BotRef(row["bot_id"], row["bot_name"], row["bot_source"], row["bot_profile"], bool(row["bot_archived"]))
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            owner=row["owner"],
            bot=bot,
            title=row["title"],
            title_set=bool(row["title_set"]),
            archived=bool(row["archived"]),
            runner_id=row["runner_id"],
            hermes_session_id=row["hermes_session_id"],
            created_at=int(row["created_at"]),
            updated_at=int(row["updated_at"]),
            last_activity_at=int(row["last_activity_at"]),
            message_count=int(row["message_count"]),
            live_turn_id=row["live_turn_id"],
            session_reusable=bool(row["session_reusable"]),
        )


def check_title(value: str) -> str:
    try:
        title = one_line("title", value)
    except TextRefused as exc:
        raise TalariaError("invalid_request", str(exc)) from None
    if len(title) > MAX_CONVERSATION_TITLE_CHARS:
        raise TalariaError("invalid_request", f"title must be at most {MAX_CONVERSATION_TITLE_CHARS} characters")
    return title


class Conversations:
    def __init__(self, store: Store, clock: Clock, allowed: Allowed) -> None:
        self.store = store
        self.clock = clock
        self.allowed = allowed

    def get(self, account: Account, conversation_id: str) -> Conversation:
        with self.store.read() as tx:
            return self.visible(tx, account, conversation_id)

    def owner_of(self, tenant: str, conversation_id: str) -> str | None:
        with self.store.read() as tx:
            row = tx.one("chat_conversation_owner", tenant=tenant, id=conversation_id)
        return str(row["owner"]) if row is not None else None

    def list(
        self, account: Account, *, archived: bool, after: tuple[int, str] | None, limit: int
    ) -> list[Conversation]:
        """A page of the account's conversations by last activity, newest first (ties by id)."""
        with self.store.read() as tx:
            rows = tx.all(
                "chat_conversation_list", tenant=account.tenant, owner=account.username, archived=int(archived),
                limit=limit, cursor_at=after[0] if after else None, cursor_id=after[1] if after else None,
            )  # fmt: skip
        return [Conversation.from_row(row) for row in rows]

    def start(self, account: Account, *, bot_id: str, title: str | None = None) -> Conversation:
        chosen = check_title(title) if title is not None else None
        with self.store.read() as tx:
            bot = tx.one("bot_get", tenant=account.tenant, owner=account.username, id=bot_id)
        if bot is None:
            raise TalariaError("not_found", "no such bot")
        if bot["archived"]:
            raise TalariaError("bot_archived", "the bot is archived")
        require_allowed(self.allowed, account, bot["source"], bot["profile"])
        now = self.clock.now_ms()
        conversation_id = mint("cnv", now)
        with self.store.write() as tx:
            again = tx.one("bot_get", tenant=account.tenant, owner=account.username, id=bot_id)
            if again is None or again["archived"]:
                raise TalariaError("bot_archived", "the bot is archived")
            self._require_room(tx, account)
            tx.run(
                "chat_conversation_insert", id=conversation_id, tenant=account.tenant, owner=account.username,
                bot_id=bot_id, title=chosen or DEFAULT_TITLE, title_set=int(chosen is not None), now=now,
            )  # fmt: skip
            self._audit(tx, account, conversation_id, "chat.conversation.created", None, OPEN)
            return self.visible(tx, account, conversation_id)

    def update(
        self,
        account: Account,
        conversation_id: str,
        *,
        title: str | None = None,
        archived: bool | None = None,
        changed: Callable[[Tx, Conversation], None] | None = None,
    ) -> Conversation:
        """Change the title or archived flag; ``changed(tx, updated)`` runs in the transaction of a change (the
        hub stages its stream event there), not for a repeat."""
        chosen = check_title(title) if title is not None else None
        with self.store.read() as tx:
            before = self.visible(tx, account, conversation_id)
        if archived is False and before.archived:
            if before.bot.archived:
                raise TalariaError("bot_archived", "the bot is archived")
            require_allowed(self.allowed, account, before.bot.source, before.bot.profile)
        with self.store.write() as tx:
            current = self.visible(tx, account, conversation_id)
            new_title = current.title if chosen is None else chosen
            new_archived = current.archived if archived is None else archived
            title_set = current.title_set or chosen is not None
            if (new_title, new_archived, title_set) == (current.title, current.archived, current.title_set):
                return current
            if current.archived and not new_archived:
                self._require_room(tx, account)
            tx.run(
                "chat_conversation_update", id=current.id, title=new_title,
                title_set=int(title_set), archived=int(new_archived),
                now=self.clock.now_ms(),
            )  # fmt: skip
            if new_archived != current.archived:
                kind = "chat.conversation.archived" if new_archived else "chat.conversation.unarchived"
                moved = (OPEN, ARCHIVED) if new_archived else (ARCHIVED, OPEN)
                self._audit(tx, account, current.id, kind, *moved)
            updated = self.visible(tx, account, current.id)
            if changed is not None:
                changed(tx, updated)
            return updated

    def visible(self, tx: Tx, account: Account, conversation_id: str) -> Conversation:
        """The account's conversation ``conversation_id``; anyone else's, or none, is 404 ``not_found``."""
        row = tx.one("chat_conversation_get", tenant=account.tenant, owner=account.username, id=conversation_id)
        if row is None:
            raise TalariaError("not_found", "no such conversation")
        return Conversation.from_row(row)

    def _require_room(self, tx: Tx, account: Account) -> None:
        tx.run("account_lock", username=account.username)  # concurrent creates count one after the other
        live = tx.one("chat_conversation_live_count", tenant=account.tenant, owner=account.username)
        if live is not None and int(live["n"]) >= MAX_LIVE_CONVERSATIONS:
            raise TalariaError(
                "conversation_limit", f"you have {MAX_LIVE_CONVERSATIONS} conversations; archive one first"
            )

    def _audit(
        self, tx: Tx, account: Account, conversation_id: str, kind: str, from_state: str | None, to_state: str
    ) -> None:
        audit.append(
            tx,
            now_ms=self.clock.now_ms(),
            type=kind,
            tenant=account.tenant,
            actor=owner_actor(account),
            subject=audit.Subject(conversation=conversation_id),
            from_state=from_state,
            to_state=to_state,
        )
