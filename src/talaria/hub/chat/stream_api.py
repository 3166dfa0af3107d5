"""The live stream route (chat.md 4.1): ``GET /api/conversations/{id}/events[?after=<id>]``.

Checks in order: session (401), the conversation is the caller's (404 ``not_found``), ``Last-Event-ID`` and
``after`` are decimal integers >= 0 (400 ``invalid_request``; the header wins, a reconnect keeps the original URL),
the account holds fewer than ``MAX_CHAT_STREAMS_PER_ACCOUNT`` open streams (429 ``chat_stream_limit``). No CSRF
token: it changes nothing.

Then 200 ``text/event-stream``, held open: ``retry: 3000``, the events of ``ChatEvents.subscribe`` (chat.md 4.2), a
``: keepalive`` comment after ``chat_keepalive_s`` of silence. It ends without an event when its subscription ends
(after a ``stream.reset``, at hub shutdown, when far behind), when the web session no longer holds at a keepalive
(signed out, expired, account disabled or its ``auth_version`` changed), or when the client goes away. Nothing of
an event's data is logged.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Final

import structlog
from fastapi import APIRouter, Header, Query
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, UserDep
from talaria.hub.api.websession import WebRoute, WebUser
from talaria.hub.chat.delivery import Subscription
from talaria.hub.openapi import refusals, text_answer
from talaria.hub.resources import Hub
from talaria.limits import CHAT_STREAM_RETRY_MS, MAX_CHAT_STREAMS_PER_ACCOUNT

log = structlog.get_logger("talaria.hub")

router = APIRouter(prefix="/api/conversations", tags=["conversations"], route_class=WebRoute)

_DECIMAL = re.compile(r"^[0-9]+\Z")
# Above any id a conversation can reach: a resume point this long is simply "above the last issued".
_MAX_DIGITS = 30
RETRY: Final = f"retry: {CHAT_STREAM_RETRY_MS}\n\n".encode()
KEEPALIVE: Final = b": keepalive\n\n"
HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
_ID_SCHEMA = {"pattern": "^[0-9]+$"}
_STREAM = text_answer(
    "text/event-stream",
    "server-sent events (chat.md 4): `retry: 3000`, then `id:`/`event:`/`data:` events, `: keepalive` comments, "
    "`stream.reset` (no id) when the resume point cannot be served",
)

AfterQuery = Annotated[
    str | None,
    Query(description="resume after this event id (a decimal integer >= 0)", json_schema_extra=_ID_SCHEMA),
]
LastEventIdHeader = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="a reconnect's resume point; wins over `after`",
           json_schema_extra=_ID_SCHEMA),
]  # fmt: skip


def resume_point(last_event_id: str | None, after: str | None) -> int | None:
    """The resume point: ``Last-Event-ID`` if sent, else ``after``, else None (follow from now). Raises
    ``TalariaError("invalid_request")`` for a value that is not a decimal integer >= 0, whichever was sent."""
    for name, value in (("Last-Event-ID", last_event_id), ("after", after)):
        if value is not None and not _DECIMAL.match(value):
            raise TalariaError("invalid_request", f"{name} must be a decimal integer >= 0")
    chosen = last_event_id if last_event_id is not None else after
    if chosen is None:
        return None
    digits = chosen.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS


class EventStream(StreamingResponse):
    """A ``StreamingResponse`` that runs ``on_close`` once whenever and however it ends (the client gone, the
    body finished, or cancelled before the body ever started), so a counted stream is always given back."""

    def __init__(self, frames: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        super().__init__(frames, headers=HEADERS)
        self._frames = frames
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._frames.aclose()
            finally:
                self._on_close()


async def _frames(hub: Hub, user: WebUser, subscription: Subscription) -> AsyncGenerator[bytes, None]:
    yield RETRY
    while True:
        event = await subscription.next(hub.chat_streams.keepalive_s)
        if event is not None:
            yield event.sse().encode()
            continue
        if subscription.ended:
            return
        try:
            valid = await run_in_threadpool(hub.sessions.still_valid, user)
        except TalariaError as exc:  # the store does not answer: end it; the client reconnects and is checked
            log.warning("chat_stream_session_check_failed", code=exc.code)
            valid = False
        if not valid:
            return
        yield KEEPALIVE


@router.get(
    "/{conversation_id}/events",
    openapi_extra=refusals("not_found", "invalid_request", "chat_stream_limit", answers=_STREAM),
)
async def conversation_events(
    conversation_id: str, user: UserDep, hub: HubDep, after: AfterQuery = None, last_event_id: LastEventIdHeader = None
) -> Response:
    """The conversation's live stream of server-sent events (chat.md 4), held open until the client leaves, its
    session ends or the hub stops; resume with ``Last-Event-ID`` (a reconnect) or ``after``."""
    await run_in_threadpool(hub.conversations.get, user.account, conversation_id)
    resume = resume_point(last_event_id, after)
    account = user.account.username
    stream_id = await run_in_threadpool(hub.chat_streams.take, account)
    if stream_id is None:
        raise TalariaError(
            "chat_stream_limit", f"at most {MAX_CHAT_STREAMS_PER_ACCOUNT} open event streams per account"
        )
    try:
        subscription = await run_in_threadpool(hub.chat_events.subscribe, conversation_id, resume)
    except BaseException:
        hub.chat_streams.give_back(account, stream_id)
        raise

    def closed() -> None:
        subscription.close()
        hub.chat_streams.give_back(account, stream_id)

    return EventStream(_frames(hub, user, subscription), closed)
