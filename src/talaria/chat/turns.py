"""Turns of a conversation as its owner sees them (chat.md 3.2-3.3, 5.6): accepting a message, reading turns and
the transcript, asking a turn to stop.

Acceptance is one write transaction: the user message, a ``pending`` turn carrying the owner's ``auth_version``,
the title of an untitled conversation, ``chat.turn.started`` with the keyed digest of the text (never the text),
and, with an ``Idempotency-Key``, the 202 answer itself, so that the same key and body replay those bytes for 24 h.
Nothing reaches a node here: the turn engine picks the turn up after the commit.

Checks, in order (after the door's session, CSRF, visibility and key syntax and body checks): replay; archived
(409 ``conversation_archived``); bot archived (409 ``bot_archived``); bot allowed (403 ``bot_not_allowed``); no
live turn (409 ``turn_in_progress``); ``chat.per_account`` and ``chat.per_hub`` (429 ``chat_turn_limit``,
``chat_busy``, ``Retry-After: 5``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.accounts.service import Account
from talaria.canonical import canonical_json, digest, sha256_hex
from talaria.chat import attachments
from talaria.chat.attachments import attachment_json
from talaria.chat.bots import Allowed, owner_actor, require_allowed
from talaria.chat.conversations import Conversation, Conversations
from talaria.chat.records import LIVE, ChatMessage, ChatTurn, message_json, turn_json
from talaria.chat.turn_writes import Ended, NewMessage, end_turn, lock_turn, set_turn, store_message
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import AUTO_TITLE_CHARS, CHAT_IDEMPOTENCY_S, CHAT_RETRY_AFTER_S
from talaria.settings import Settings
from talaria.store.interface import Store, Tx


@dataclass(frozen=True)
class Accepted:
    turn: ChatTurn
    message: ChatMessage
    body: bytes  # the 202 answer's bytes (stored with the key; a replay sends them again)
    replayed: bool
    retitled: bool  # the first message titled the conversation (conversation.updated)
    attachments: tuple[dict[str, Any], ...] = ()  # the message's attachments, as JSON


def auto_title(text: str) -> str:
    """The first non-blank line, trimmed; over 80 characters its first 80 and ``…`` (chat.md 3.2)."""
    line = next(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= AUTO_TITLE_CHARS else line[:AUTO_TITLE_CHARS] + "…"


class ChatTurns:
    def __init__(
        self, store: Store, clock: Clock, key: AuditKey, allowed: Allowed, conversations: Conversations,
        settings: Settings,
    ) -> None:  # fmt: skip
        self.store = store
        self.clock = clock
        self.key = key
        self.allowed = allowed
        self.conversations = conversations
        self.settings = settings

    # --- reads ---------------------------------------------------------------------------------------------------

    def get(self, account: Account, conversation_id: str, turn_id: str) -> ChatTurn:
        with self.store.read() as tx:
            self.conversations.visible(tx, account, conversation_id)
            return self._get(tx, account, conversation_id, turn_id)

    def live(self, tx: Tx, conversation_id: str) -> ChatTurn | None:
        row = tx.one("chat_turn_live", conversation_id=conversation_id)
        return ChatTurn.from_row(row) if row is not None else None

    def message(self, account: Account, conversation_id: str, message_id: str) -> ChatMessage:
        """One stored message of the owner's conversation; 404 ``not_found`` if either is not theirs."""
        with self.store.read() as tx:
            self.conversations.visible(tx, account, conversation_id)
            row = tx.one("chat_message_get", conversation_id=conversation_id, id=message_id)
        if row is None:
            raise TalariaError("not_found", "no such message")
        return ChatMessage.from_row(row)

    def messages(self, tx: Tx, conversation_id: str, *, before: int | None, limit: int) -> list[ChatMessage]:
        """A page of the conversation's messages, newest first by ordinal, below ``before``."""
        rows = tx.all("chat_message_page", conversation_id=conversation_id, before=before, limit=limit)
        return [ChatMessage.from_row(row) for row in rows]

    # --- writes --------------------------------------------------------------------------------------------------

    def accept(
        self,
        account: Account,
        conversation_id: str,
        *,
        text: str,
        body: dict[str, Any],
        key: str | None,
        attachment_ids: Sequence[str] = (),
        accepted: Callable[[Tx, Accepted], None] | None = None,
    ) -> Accepted:
        """Accept the owner's message ``text`` (already checked) as a new turn; ``body`` is the request body,
        whose canonical JSON digest an ``Idempotency-Key`` is bound to. ``accepted(tx, made)`` runs in the
        transaction of a new turn (the hub stages its stream events there), not for a replay."""
        key_hash = sha256_hex(key) if key is not None else None
        request_digest = digest(body)
        now = self.clock.now_ms()
        with self.store.read() as tx:
            before = self.conversations.visible(tx, account, conversation_id)
            replay = self._replay(tx, conversation_id, key_hash, request_digest, now)
        if replay is not None:
            return replay
        self._check_open(before)
        require_allowed(self.allowed, account, before.bot.source, before.bot.profile)
        turn_id, message_id = mint("trn", now), mint("msg", now)
        with self.store.write() as tx:
            # across replicas (scale.md 3.7): the owner's row, then the conversation's, before anything is counted
            tx.run("account_lock", username=account.username)
            tx.run("chat_conversation_lock", id=conversation_id)
            conversation = self.conversations.visible(tx, account, conversation_id)
            replay = self._replay(tx, conversation_id, key_hash, request_digest, now)
            if replay is not None:
                return replay
            self._check_open(conversation)
            for attachment_id in attachment_ids:  # this conversation's (404), still uploaded (409) - before the rest
                held = attachments.get(tx, conversation_id, attachment_id)
                if held.state != "uploaded":
                    raise TalariaError("attachment_used", "an attachment is already in a message")
            if self.live(tx, conversation_id) is not None:
                raise TalariaError("turn_in_progress", "this conversation already has a turn in progress")
            self._check_room(tx, account)
            first = int(tx.one("chat_message_user_count", conversation_id=conversation_id)["n"]) == 0  # type: ignore[index]
            message = store_message(
                tx, conversation_id,
                NewMessage(role="user", author=account.username, content=text, turn_id=turn_id, id=message_id), now,
            )  # fmt: skip
            held_now = attachments.attach(tx, conversation_id, list(attachment_ids), message.id, now)
            shown = [attachment_json(a) for a in held_now]
            tx.run(
                "chat_turn_insert", id=turn_id, conversation_id=conversation_id, tenant=account.tenant,
                owner=account.username, state="pending", trigger="user", trigger_message_id=message.id,
                auth_version=account.auth_version, prompt=None, idempotency_key_hash=None, request_digest=None,
                response_body=None, now=now,
            )  # fmt: skip
            retitled = first and not conversation.title_set
            if retitled:
                tx.run("chat_conversation_titled", id=conversation_id, title=auto_title(text), now=now)
            audit.append(
                tx, now_ms=now, type="chat.turn.started", tenant=account.tenant, actor=owner_actor(account),
                subject=audit.Subject(conversation=conversation_id, turn=turn_id), from_state=None, to_state="pending",
                evidence=audit.Evidence(
                    "chat_message", self.key.digest({"attachments": [a.sha256 for a in held_now], "text": text})
                ),
            )  # fmt: skip
            turn = self._get(tx, account, conversation_id, turn_id)
            answer = canonical_json({"message": message_json(message, shown), "turn": turn_json(turn)})
            if key_hash is not None:
                tx.run(
                    "chat_turn_keep_answer", id=turn_id, key_hash=key_hash, request_digest=request_digest,
                    response_body=answer,
                )  # fmt: skip
            made = Accepted(turn, message, answer, replayed=False, retitled=retitled, attachments=tuple(shown))
            if accepted is not None:
                accepted(tx, made)
        return made

    def stop(
        self, account: Account, conversation_id: str, turn_id: str,
        ended: Callable[[Tx, Ended], None] | None = None,
    ) -> tuple[ChatTurn, Ended | None]:  # fmt: skip
        """Ask a turn to stop (chat.md 5.6): a terminal one is 409 ``turn_finished``; a queued or pending one ends
        ``interrupted`` ``stopped`` at once (``Ended``; ``ended(tx, it)`` runs in that transaction, where the hub
        stages its stream events); a running or recovering one is marked ``stopRequested`` for the turn engine
        (repeats change nothing)."""
        now = self.clock.now_ms()
        with self.store.write() as tx:
            self.conversations.visible(tx, account, conversation_id)
            turn = lock_turn(tx, self._get(tx, account, conversation_id, turn_id).id)
            if turn.ended:
                raise TalariaError("turn_finished", "this turn has already ended")
            if turn.state in ("queued", "pending"):
                done = end_turn(
                    tx, set_turn(tx, turn, now, stop_requested=True), state="interrupted", code="stopped",
                    error="stopped at the owner's request", actor=owner_actor(account), key=self.key, now_ms=now,
                )  # fmt: skip
                if ended is not None:
                    ended(tx, done)
                return done.turn, done
            if turn.stop_requested:
                return turn, None
            return set_turn(tx, turn, now, stop_requested=True), None

    # --- rules ---------------------------------------------------------------------------------------------------

    def _get(self, tx: Tx, account: Account, conversation_id: str, turn_id: str) -> ChatTurn:
        row = tx.one(
            "chat_turn_get", tenant=account.tenant, owner=account.username, conversation_id=conversation_id,
            id=turn_id,
        )  # fmt: skip
        if row is None:
            raise TalariaError("not_found", "no such turn")
        return ChatTurn.from_row(row)

    def _replay(
        self, tx: Tx, conversation_id: str, key_hash: str | None, request_digest: str, now: int
    ) -> Accepted | None:
        if key_hash is None:
            return None
        since = now - CHAT_IDEMPOTENCY_S * 1000
        row = tx.one("chat_turn_by_key", conversation_id=conversation_id, key_hash=key_hash, since=since)
        if row is None:
            return None
        if row["request_digest"] != request_digest:
            raise TalariaError("idempotency_key_reused", "this Idempotency-Key was used with another message")
        turn = ChatTurn.from_row(row)
        stored = tx.one("chat_message_get", conversation_id=conversation_id, id=turn.trigger_message_id)
        assert stored is not None
        return Accepted(turn, ChatMessage.from_row(stored), bytes(row["response_body"]), replayed=True, retitled=False)

    @staticmethod
    def _check_open(conversation: Conversation) -> None:
        if conversation.archived:
            raise TalariaError("conversation_archived", "this conversation is archived")
        if conversation.bot.archived:
            raise TalariaError("bot_archived", "the bot is archived")

    def _check_room(self, tx: Tx, account: Account) -> None:
        retry = {"Retry-After": str(CHAT_RETRY_AFTER_S)}
        mine = tx.one("chat_turn_live_count_owner", tenant=account.tenant, owner=account.username)
        if mine is not None and int(mine["n"]) >= self.settings.chat_per_account:
            raise TalariaError(
                "chat_turn_limit", f"you have {self.settings.chat_per_account} turns in progress; wait for one",
                headers=retry,
            )  # fmt: skip
        tx.run("chat_turn_limit_lock")  # every acceptance's count of every live turn, one at a time
        every = tx.one("chat_turn_live_count_all")
        if every is not None and int(every["n"]) >= self.settings.chat_per_hub:
            raise TalariaError("chat_busy", "the hub is running as many chat turns as it may; retry", headers=retry)


__all__ = ["LIVE", "Accepted", "ChatTurns", "auto_title"]
