"""What the chat routes and the turn engine use to issue and follow a conversation's stream events (chat.md 4.2),
whichever backend keeps them: ``ChatEvents`` (hub/chat/events.py) in one hub's memory on SQLite, or
``SharedChatEvents`` (hub/chat/shared_events.py) in PostgreSQL's ``stream_event`` table (scale.md 4.2).

A writer issues the events of a change with the change itself::

    with events.locked(conversation_id):
        with store.write() as tx:
            ...                                        # the change
            staged = events.stage(tx, conversation_id, emits)
        events.send(staged)                            # after the commit

``stage`` writes the events in the transaction where the store keeps them (so a snapshot read in one transaction
is exactly the events up to its ``lastEventId``, on any replica), and ``send`` announces them after the commit (in
memory: that is when they get their ids). ``emit`` issues one event in its own transaction (a delta).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol

from talaria.hub.chat.delivery import ChatEvent, Subscription
from talaria.store.interface import Tx

Emits = Sequence[tuple[str, Mapping[str, Any]]]
Fence = Callable[[Tx], None]
Draft = dict[str, Any]

RESET: Final = "stream.reset"
UNKNOWN_EVENT_ID: Final = "unknown_event_id"
EVENTS_EXPIRED: Final = "events_expired"
_TYPE: Final = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+\Z")


def check_type(type: str) -> None:
    if not _TYPE.match(type):
        raise ValueError(f"not an event type: {type!r}")


@dataclass(frozen=True)
class Staged:
    """The events one write transaction issues: ``emits`` as given and, where the store keeps them, ``events``
    with their ids (empty in memory, where ids are issued by ``send``)."""

    conversation_id: str
    emits: tuple[tuple[str, Mapping[str, Any]], ...]
    events: tuple[ChatEvent, ...] = ()


def resume_refusal(resume: int, last: int, oldest: int | None) -> str | None:
    """Why ``resume`` cannot be served (a ``stream.reset`` reason, chat.md 4.2), or None: ``last`` is the newest id
    issued, ``oldest`` the oldest id retained (None: nothing retained)."""
    if resume > last:
        return UNKNOWN_EVENT_ID
    if resume == last or (oldest is not None and resume >= oldest - 1):
        return None
    return EVENTS_EXPIRED


class StreamEvents(Protocol):
    listeners: list[Callable[[str], None]]

    def locked(self, conversation_id: str) -> AbstractContextManager[None]:
        """This process's lock of the conversation's stream; never taken inside a store transaction."""
        ...

    def stage(self, tx: Tx, conversation_id: str, emits: Emits) -> Staged:
        """Inside the write transaction of the change ``emits`` announce; ``send`` the result after it commits.
        Raises ``TalariaError("not_found")`` for a conversation the store does not hold (where it checks then)."""
        ...

    def send(self, staged: Staged) -> list[int]:
        """After the commit: deliver and announce what ``stage`` gave; the events' ids."""
        ...

    def emit(self, conversation_id: str, type: str, data: Mapping[str, Any], *, fence: Fence | None = None) -> int:
        """One event in its own transaction (``fence(tx)`` first, where there is one); its id. Never inside a store
        transaction."""
        ...

    def last_event_id(self, conversation_id: str, tx: Tx | None = None) -> int:
        """The newest id issued for the conversation (0 before any); read in ``tx`` where given (a snapshot)."""
        ...

    def draft(self, tx: Tx, conversation_id: str, turn_id: str, local: Callable[[str], Draft | None]) -> Draft | None:
        """The live turn's streamed text not stored yet, as of the snapshot ``tx``; ``local`` is the turn engine's
        own view, which a single hub uses."""
        ...

    def subscribe(self, conversation_id: str, resume: int | None) -> Subscription:
        """A subscription to the conversation's events from ``resume`` (chat.md 4.2); off the event loop."""
        ...

    def prune(self) -> int:
        """Drop what idle streams retain; how many streams or events were dropped."""
        ...

    def close_all(self) -> None:
        """End every subscription, and every later one at birth (hub shutdown). Idempotent."""
        ...
