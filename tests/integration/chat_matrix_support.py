"""What the chat route matrix (test_chat_route_matrix.py) is built from: the chat routes read from the hub app's
route table, the chat tables' snapshot, one request sent without waiting on a held-open stream, and the world the
matrix probes (Alice's bot, conversations, turns, messages, attachments and pending approval; four other people,
each with a completed chat of their own), over a real hub, two real runner processes and the Hermes fixture."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from talaria.clock import SystemClock
from talaria.hub.api.websession import STATE_CHANGING
from talaria.hub.app import create_app
from talaria.settings import Settings
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.hermes.chat_support import make_bot, messages, start_chat, wait_turn
from tests.integration.runner_support import RunnerProcess, register_node, wait_until
from tests.integration.web_support import cheapen_argon2

# chat.md 3.2's routes (``/api/bots``, ``/api/bot-profiles``, ``/api/conversations``) and 6.1's pages with their
# parts: a route whose path starts so is a chat route (broad on purpose: ``/api/bot-…`` or ``/api/chat…`` joins).
CHAT_PREFIXES = ("/api/bot", "/api/conversation", "/api/chat", "/chats", "/bots")
# The chat tables (chat.md 2) and the audit chain, which no refused request may touch.
SNAPSHOT_TABLES = ("bot", "chat_conversation", "chat_turn", "chat_message", "chat_attachment", "chat_approval",
                   "audit_event")  # fmt: skip
ACME = "acme"  # the other tenant


@dataclass(frozen=True)
class ChatRoute:
    """One method of one chat route of the app's route table."""

    method: str
    path: str
    path_params: tuple[str, ...]
    query_params: tuple[str, ...]
    header_params: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def mutating(self) -> bool:
        return self.method in STATE_CHANGING

    def url(self, ids: dict[str, str]) -> str:
        return self.path.format(**{name: ids[name] for name in self.path_params})


def chat_routes() -> list[ChatRoute]:
    """Every method of every route of the hub app whose path starts with a chat prefix, read from the route table
    of the app the factory builds (nothing opened; included routers flattened as FastAPI serves them). A chat
    path served by anything but a FastAPI route fails: the matrix could not read its parameters."""
    app = create_app(Settings(data_dir=Path("/nonexistent/talaria-chat-matrix")), run_reaper=False)
    found: list[ChatRoute] = []
    for context in iter_route_contexts(app.web.routes):
        path = str(context.path or "")
        if not path.startswith(CHAT_PREFIXES):
            continue
        route = context.original_route
        assert isinstance(route, APIRoute), f"{path}: a chat path the matrix cannot read ({type(route).__name__})"
        params = tuple(re.findall(r"{(\w+)(?::\w+)?}", path))
        query = tuple(param.alias for param in route.dependant.query_params)
        headers = tuple(param.alias for param in route.dependant.header_params)
        for method in sorted(set(context.methods or ()) - {"HEAD", "OPTIONS"}):
            found.append(ChatRoute(method, path, params, query, headers))
    return sorted(found, key=lambda r: (r.path, r.method))


def chat_tables(data_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the chat tables and the audit chain, read through a read-only connection of its own."""
    conn = sqlite3.connect(f"file:{data_dir / 'talaria.sqlite3'}?mode=ro", uri=True)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall() for table in SNAPSHOT_TABLES}
    finally:
        conn.close()


@dataclass(frozen=True)
class Answer:
    status: int
    media_type: str
    body: str
    location: str = ""

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def call(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Answer:
    """One request; a live stream's body is not read (it would be held open), only its status and media type."""
    response = client.send(client.build_request(method, url, **kwargs), stream=True)
    try:
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        body = "" if media_type == "text/event-stream" else response.read().decode()
        return Answer(response.status_code, media_type, body, response.headers.get("location", ""))
    finally:
        response.close()


@dataclass
class Person:
    """Someone probing Alice's objects, with a bot, a conversation and a completed turn of their own."""

    name: str
    role: str
    tenant: str
    client: httpx.Client
    own: dict[str, str] = field(default_factory=dict)


@dataclass
class Alice:
    client: httpx.Client
    ids: dict[str, list[str]]  # a path or body parameter's name → Alice's ids for it, the most telling first
    texts: list[str]  # her free text (names, instructions, title, messages, file names): never in audit
    digests: list[tuple[str, Any]]  # (evidence kind, the canonical JSON whose keyed digest it holds)


@dataclass
class World:
    server: HubServer
    hermes: HermesFixture
    alice: Alice
    people: dict[str, Person]


SECRET = {
    "bot": "Helper-a1ce",
    "instructions": "Alice's instructions: the vault code is 5521.",
    "title": "Alice's secret plans",
    "first": "alice first secret 7731",
    "reply": "Alice's secret reply 8842",
    "risky": "alice risky 9911",
    "command": "rm -rf alice-build-9911",
    "file": "plan-a1ce.txt",
    "file_body": "alice's secret file body 3310",
    "draft": "draft-a1ce.txt",
    "old_bot": "Old-a1ce",
}
PEOPLE = (("bob", "user", "default"), ("ada", "admin", "default"), ("carol", "user", ACME),
          ("oscar", "admin", ACME))  # fmt: skip


def _upload(client: httpx.Client, conversation_id: str, name: str, data: bytes) -> dict[str, Any]:
    answer = client.post(f"/api/conversations/{conversation_id}/attachments", params={"name": name}, content=data,
                         headers={"Content-Type": "text/plain"})  # fmt: skip
    assert answer.status_code == 201, answer.text
    attachment: dict[str, Any] = answer.json()["attachment"]
    return attachment


def _turn(client: httpx.Client, conversation_id: str, body: dict[str, Any]) -> str:
    answer = client.post(f"/api/conversations/{conversation_id}/turns", json=body)
    assert answer.status_code == 202, answer.text
    turn_id: str = answer.json()["turn"]["id"]
    return turn_id


def _completed(client: httpx.Client, conversation_id: str, body: dict[str, Any]) -> str:
    turn_id = _turn(client, conversation_id, body)
    assert wait_turn(client, conversation_id, turn_id)["state"] == "completed"
    return turn_id


def _alice(server: HubServer, hermes: HermesFixture) -> Alice:
    client = login(server, "alice")
    bot_id = make_bot(client, SECRET["bot"], instructions=SECRET["instructions"])
    conversation = client.post("/api/conversations", json={"botId": bot_id, "title": SECRET["title"]})
    assert conversation.status_code == 201, conversation.text
    conversation_id: str = conversation.json()["conversation"]["id"]
    sent = _upload(client, conversation_id, SECRET["file"], SECRET["file_body"].encode())
    hermes.reply_for(SECRET["first"], SECRET["reply"])
    done = _completed(client, conversation_id, {"text": SECRET["first"], "attachments": [sent["id"]]})
    stored = messages(client, conversation_id)
    user_message = next(m["id"] for m in stored if m["role"] == "user")
    reply = next(m["id"] for m in stored if m["role"] == "assistant" and m["final"])
    draft = _upload(client, conversation_id, SECRET["draft"], b"an unsent draft")
    hermes.approval_for(SECRET["risky"], command=SECRET["command"])
    live = _turn(client, conversation_id, {"text": SECRET["risky"]})

    def asked() -> list[dict[str, Any]]:
        snapshot = client.get(f"/api/conversations/{conversation_id}/messages").json()
        return list((snapshot["liveTurn"] or {}).get("approvals") or [])

    wait_until(lambda: bool(asked()), timeout=60, what="Alice's approval request")
    approval_id: str = asked()[0]["id"]
    old_bot = make_bot(client, SECRET["old_bot"])
    archived = start_chat(client, bot_id)
    empty = start_chat(client, bot_id)  # her ids of the first conversation must not work through this one
    assert client.patch(f"/api/conversations/{archived}", json={"archived": True}).status_code == 200
    assert client.patch(f"/api/bots/{old_bot}", json={"archived": True}).status_code == 200
    ids = {
        "bot_id": [bot_id, old_bot],
        "conversation_id": [conversation_id, archived, empty],
        "turn_id": [live, done],
        "attachment_id": [draft["id"], sent["id"]],
        "message_id": [user_message, reply],
        "approval_id": [approval_id],
    }
    digests = [
        ("chat_bot", {"instructions": SECRET["instructions"], "name": SECRET["bot"]}),
        ("chat_message", {"attachments": [sent["sha256"]], "text": SECRET["first"]}),
        ("chat_message", {"attachments": [], "text": SECRET["risky"]}),
        ("chat_reply", {"text": SECRET["reply"]}),
    ]
    texts = [v for k, v in SECRET.items() if k != "file_body"]
    return Alice(client, ids, texts, digests)


def _person(server: HubServer, name: str, role: str, tenant: str) -> Person:
    client = login(server, name)
    bot_id = make_bot(client, f"Mine of {name}")
    conversation_id = start_chat(client, bot_id)
    turn_id = _completed(client, conversation_id, {"text": f"hello from {name}"})
    own = {"bot_id": bot_id, "conversation_id": conversation_id, "turn_id": turn_id}
    return Person(name, role, tenant, client, own)


@contextmanager
def chat_world(tmp_path: Path) -> Iterator[World]:
    """Alice (a user of tenant ``default``) and her chats; ``bob`` (a user) and ``ada`` (an admin) of her tenant,
    ``carol`` (a user) and ``oscar`` (an admin) of tenant ``acme``; a runner of each tenant on one Hermes
    fixture, which holds Alice's approval for the whole module (a long ``clarify_timeout``)."""
    with ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        cheapen_argon2(patch)
        hermes = stack.enter_context(HermesFixture())
        hermes.knobs.clarify_timeout = 3600
        server = HubServer(tmp_path / "data", SystemClock()).start()
        stack.callback(server.stop)
        profiles = {"local": ["default"]}
        add_account(server, "alice", allowed_profiles=profiles)
        for name, role, tenant in PEOPLE:
            add_account(server, name, role, tenant=tenant, allowed_profiles=profiles)
        for tenant in ("default", ACME):
            path = register_node(server, tmp_path / f"node-{tenant}", hermes_url=hermes.url,
                                 session_token=hermes.session_token, tenant=tenant, name=f"node-{tenant}")  # fmt: skip
            runner = RunnerProcess(path, tmp_path / f"logs-{tenant}", f"runner-{tenant}")
            stack.callback(runner.close)
            runner.wait_for("runner connected", timeout=60)
        alice = _alice(server, hermes)
        stack.callback(alice.client.close)
        people = {name: _person(server, name, role, tenant) for name, role, tenant in PEOPLE}
        for person in people.values():
            stack.callback(person.client.close)
        yield World(server, hermes, alice, people)
