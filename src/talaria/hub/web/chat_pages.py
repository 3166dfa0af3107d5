"""The chat pages (chat.md 6): ``/chats``, ``/bots``, a conversation's page ``/chats/{id}`` and its two parts.

Like every page they read through the JSON API's route functions (ADR 0018) and change nothing themselves: the
forms are ``/static/app.js``'s, the composer, the live stream and the approval cards ``/static/chat.js``'s. A
conversation's page is the snapshot of ``GET …/messages`` (messages, the live turn's draft, ``lastEventId``) that
the script follows with one ``EventSource`` (ADR 0034). Its parts:

- ``/chats/{id}/transcript``: the snapshot again, fetched after a ``stream.reset``;
- ``/chats/{id}/messages/{messageId}``: one stored message's article, swapped in on ``message.complete`` and the
  tool events, so every message is rendered by the server (assistant markdown with ``markdown.render``).

An unknown conversation and another account's are the same 404 page; the parts answer the canonical JSON errors.
"""

from __future__ import annotations

import json
from typing import Any, Final

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from talaria.chat.records import message_json
from talaria.errors import TalariaError
from talaria.hub.api.websession import WebUser
from talaria.hub.chat import bots_api, conversations_api, turns_api
from talaria.hub.web import markdown
from talaria.hub.web.frame import hub_of, link, missing, page_user, part_of, refused, render
from talaria.hub.web.frame import page_of as _page_of

router = APIRouter(include_in_schema=False)

WORKING: Final = "Working…"


def _archived(raw: str | None) -> bool:
    return raw in ("1", "true")


async def _all_bots(user: WebUser, request: Request, archived: bool) -> list[dict[str, Any]]:
    """The caller's bots, by name (the API lists them newest first, a page at a time)."""
    hub, found, cursor = hub_of(request), [], None
    while True:
        listed = await bots_api.list_bots(user=user, hub=hub, archived=archived, limit=100, cursor=cursor)
        found += listed["bots"]
        cursor = listed["nextCursor"]
        if cursor is None:
            return sorted(found, key=lambda b: (b["name"].casefold(), b["id"]))


# --- /chats and /bots --------------------------------------------------------------------------------------------


async def _chats_view(request: Request, user: WebUser, archived: bool, cursor: str | None,
                      chosen: str | None) -> dict[str, Any]:  # fmt: skip
    hub = hub_of(request)
    bots = await _all_bots(user, request, archived=False)
    listed = await conversations_api.list_conversations(user=user, hub=hub, archived=archived, limit=None,
                                                        cursor=cursor)  # fmt: skip
    flag = "1" if archived else None
    return {
        "bots": bots,
        "chosen": chosen if any(b["id"] == chosen for b in bots) else None,
        "conversations": listed["conversations"],
        "archived": archived,
        "older": link("/chats", archived=flag, cursor=listed["nextCursor"]) if listed["nextCursor"] else None,
        "newest": link("/chats", archived=flag) if cursor else None,
    }


@router.get("/chats")
async def chats_page(request: Request, archived: str | None = None, cursor: str | None = None,
                     bot: str | None = None) -> Response:  # fmt: skip
    return await _page_of(request, "chats.html",
                          lambda user: _chats_view(request, user, _archived(archived), cursor, bot),
                          title="Chats", section="chats")  # fmt: skip


async def _bots_view(request: Request, user: WebUser, archived: bool) -> dict[str, Any]:
    profiles = (await bots_api.bot_profiles(user=user, hub=hub_of(request)))["profiles"]
    choices = [{"label": f"{p['profile']} on {p['source']}", "online": p["online"],
                "value": json.dumps({"profile": p["profile"], "source": p["source"]}, sort_keys=True)}
               for p in profiles]  # fmt: skip
    return {"choices": choices, "bots": await _all_bots(user, request, archived), "archived": archived,
            "can_manage_team": user.account.can_manage_team}  # fmt: skip


@router.get("/bots")
async def bots_page(request: Request, archived: str | None = None) -> Response:
    return await _page_of(request, "bots.html", lambda user: _bots_view(request, user, _archived(archived)),
                          title="Bots", section="bots")  # fmt: skip


# --- a conversation ------------------------------------------------------------------------------------------------


def turn_status(turn: dict[str, Any]) -> str:
    """The status line of a turn (chat.md 6.2): waiting, working, or how it ended (empty when it completed)."""
    state, code = turn["state"], turn["code"]
    if state in ("queued", "pending"):
        reason = turn["waitingReason"]
        return reason[:1].upper() + reason[1:] if reason else WORKING
    if state in ("running", "recovering"):
        return WORKING
    if state == "completed":
        return ""
    if state == "interrupted" and code == "stopped":
        return "Stopped"
    if state == "uncertain":
        return f"Outcome unknown: {code}"
    return f"Not finished: {code}"


def goal_of(message: dict[str, Any]) -> str | None:
    """The goal a team tools' report-back message is about (team-tools.md 7), if it is one."""
    reference = message.get("reference")
    if isinstance(reference, dict) and reference.get("kind") == "team_goal":
        return str(reference["goalId"])
    return None


async def goal_titles(request: Request, user: WebUser, messages: list[dict[str, Any]]) -> dict[str, str]:
    wanted = {goal for goal in map(goal_of, messages) if goal is not None}
    if not wanted:
        return {}
    return await run_in_threadpool(hub_of(request).team_people.goal_titles, user.account, wanted)


def article(message: dict[str, Any], bot_name: str, titles: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``parts/chat_message.html`` shows of a stored message: the accessible name (``You``, the bot's name,
    ``<bot> used <tool>``, ``Talaria``), a note on how it ended, and its body (markdown for the bot's replies); a
    report-back message links its goal (``Open goal: <title>``, team-tools.md 12) when ``titles`` has it."""
    role, status = message["role"], message["status"]
    notes = {"interrupted": "interrupted", "error": "error", "running": "running…"}
    shown = {"id": message["id"], "role": role, "createdAt": message["createdAt"], "turnId": message["turnId"],
             "note": notes.get(status or "", ""), "tool": message["tool"], "content": message["content"],
             "goal": None}  # fmt: skip
    if role == "user":
        return shown | {"name": "You", "html": None}
    if role == "assistant":
        note = "recovered" if message["recovered"] and not shown["note"] else shown["note"]
        return shown | {"name": bot_name, "note": note, "html": markdown.render(message["content"])}
    if role == "tool":
        tool = message["tool"] or {}
        return shown | {"name": f"{bot_name} used {tool.get('name') or 'a tool'}", "html": None}
    goal = goal_of(message)
    link_to = {"id": goal, "title": titles[goal]} if goal is not None and titles and goal in titles else None
    return shown | {"name": "Talaria", "html": None, "goal": link_to}


async def _conversation_view(request: Request, user: WebUser, conversation_id: str,
                             before: str | None) -> dict[str, Any]:  # fmt: skip
    hub = hub_of(request)
    conversation = (await conversations_api.get_conversation(conversation_id=conversation_id, user=user,
                                                             hub=hub))["conversation"]  # fmt: skip
    bot = (await bots_api.get_bot(bot_id=conversation["bot"]["id"], user=user, hub=hub))["bot"]
    snapshot = await turns_api.list_messages(conversation_id=conversation_id, user=user, hub=hub, limit=None,
                                             cursor=before)  # fmt: skip
    messages = list(reversed(snapshot["messages"]))
    titles = await goal_titles(request, user, messages)
    live = snapshot["liveTurn"]
    status = turn_status(live["turn"]) if live is not None else ""
    if live is None and before is None:  # how the latest turn ended, also after a reload
        last = next((m["turnId"] for m in reversed(messages) if m["turnId"]), None)
        if last is not None:
            turn = await turns_api.get_turn(conversation_id=conversation_id, turn_id=last, user=user, hub=hub)
            status = turn_status(turn["turn"]) if turn["turn"]["state"] != "queued" else ""
    path = f"/chats/{conversation_id}"
    next_cursor = snapshot["nextCursor"]
    draft = live["draft"] if live is not None and before is None else None
    return {
        "conversation": conversation,
        "bot": bot,
        "title": conversation["title"],
        "articles": [article(m, bot["name"], titles) for m in messages],
        "draft": draft,
        "live": live,
        "approvals": live["approvals"] if live is not None else [],
        "last_event_id": snapshot["lastEventId"],
        "status_line": status,
        "streaming": before is None,
        "older": link(path, before=next_cursor) if next_cursor else None,
        "newest": path if before is not None else None,
    }


@router.get("/chats/{conversation_id}")
async def conversation_page(request: Request, conversation_id: str, before: str | None = None) -> Response:
    user = await page_user(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _conversation_view(request, user, conversation_id, before)
    except TalariaError as exc:
        return missing(request, user) if exc.code == "not_found" else refused(request, user, exc)
    return render(request, user, "chat.html", section="chats", **view)


@router.get("/chats/{conversation_id}/transcript")
async def conversation_transcript(request: Request, conversation_id: str) -> Response:
    return await part_of(request, "parts/chat_transcript.html",
                         lambda user: _conversation_view(request, user, conversation_id, None))  # fmt: skip


async def _message_view(request: Request, user: WebUser, conversation_id: str, message_id: str) -> dict[str, Any]:
    hub = hub_of(request)
    conversation = (await conversations_api.get_conversation(conversation_id=conversation_id, user=user,
                                                             hub=hub))["conversation"]  # fmt: skip
    stored = message_json(await run_in_threadpool(hub.chat_turns.message, user.account, conversation_id, message_id))
    return {"m": article(stored, conversation["bot"]["name"], await goal_titles(request, user, [stored]))}


@router.get("/chats/{conversation_id}/messages/{message_id}")
async def conversation_message(request: Request, conversation_id: str, message_id: str) -> Response:
    return await part_of(request, "parts/chat_message.html",
                         lambda user: _message_view(request, user, conversation_id, message_id))  # fmt: skip
