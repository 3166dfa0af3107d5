"""Attachments (chat.md 3.4, 7; scenario 11's API): uploaded raw with their media type and name, checked at their
edges (10 MiB, kinds, leading bytes, names, eight unsent), put in a message, sent once to Hermes (an image as
``image.attach_bytes``, a file as ``file.attach`` with a data URL whose ``ref_text`` joins the prompt), never served
back; an upload unused for an hour expires. Over a real hub; sending also over a real runner process and the Hermes
fixture."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.limits import MAX_ATTACHMENT_BYTES
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.hermes.chat_support import make_bot, messages, start_chat, wait_turn
from tests.integration.chat_web_support import chat, send
from tests.integration.runner_support import RunnerProcess, register_node
from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
ATTACHMENT_KEYS = {"id", "conversationId", "name", "mediaType", "kind", "bytes", "sha256", "state", "messageId",
                   "createdAt"}  # fmt: skip


def upload(
    client: httpx.Client, conversation_id: str, data: bytes, media_type: str, name: str | None
) -> httpx.Response:
    params = {} if name is None else {"name": name}
    return client.post(f"/api/conversations/{conversation_id}/attachments", content=data, params=params,
                       headers={"Content-Type": media_type})  # fmt: skip


def uploaded(client: httpx.Client, conversation_id: str, data: bytes, media_type: str, name: str) -> dict[str, Any]:
    answer = upload(client, conversation_id, data, media_type, name)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()["attachment"]
    return found


def test_uploads_are_checked_at_their_edges_and_change_nothing_when_refused(web: Web) -> None:
    conversation_id = chat(web)
    first = uploaded(web.user, conversation_id, PNG, "image/png", "shot.png")
    assert set(first) == ATTACHMENT_KEYS and first["id"].startswith("att_")
    assert (first["kind"], first["state"], first["bytes"], first["messageId"]) == ("image", "uploaded", len(PNG), None)
    conn = sqlite3.connect(web.server.settings.sqlite_path)
    before = conn.execute("SELECT id, state FROM chat_attachment ORDER BY id").fetchall()
    assert_error(upload(web.user, conversation_id, b"x" * (MAX_ATTACHMENT_BYTES + 1), "text/plain", "big.txt"), 413,
                 "attachment_too_large")  # fmt: skip
    assert_error(upload(web.user, conversation_id, b"PK\x03\x04zip", "application/zip", "a.zip"), 415,
                 "attachment_kind_unsupported")  # fmt: skip
    assert_error(upload(web.user, conversation_id, b"not a png", "image/png", "fake.png"), 415,
                 "attachment_kind_unsupported")  # fmt: skip
    for name in (None, "", "a/b.txt", "a\\b.txt", "x" * 256, "bell\x07.txt"):
        assert_error(upload(web.user, conversation_id, b"hi", "text/plain", name), 400, "invalid_request", name)
    for client in (web.other, web.admin):
        assert_error(upload(client, conversation_id, b"hi", "text/plain", "a.txt"), 404, "not_found")
        assert_error(client.delete(f"/api/conversations/{conversation_id}/attachments/{first['id']}"), 404,
                     "not_found")  # fmt: skip
    assert conn.execute("SELECT id, state FROM chat_attachment ORDER BY id").fetchall() == before
    conn.close()
    edge = uploaded(web.user, conversation_id, b"y" * MAX_ATTACHMENT_BYTES, "text/plain", "edge.txt")
    assert edge["bytes"] == MAX_ATTACHMENT_BYTES and edge["kind"] == "file"
    for i in range(6):
        uploaded(web.user, conversation_id, b"note", "text/markdown", f"n{i}.md")
    assert_error(upload(web.user, conversation_id, b"note", "text/csv", "ninth.csv"), 409, "attachment_limit")
    removed = web.user.delete(f"/api/conversations/{conversation_id}/attachments/{edge['id']}")
    assert removed.status_code == 200 and removed.json() == {"ok": True}
    assert uploaded(web.user, conversation_id, b"a,b", "text/csv", "ninth.csv")["kind"] == "file"


def test_an_upload_unused_for_an_hour_expires_and_an_attached_one_cannot_be_removed(web: Web) -> None:
    conversation_id = chat(web)
    old = uploaded(web.user, conversation_id, b"old", "text/plain", "old.txt")
    web.server.clock.advance(3600.001)
    fresh = uploaded(web.user, conversation_id, b"new", "text/plain", "new.txt")
    assert_error(send(web.user, conversation_id, {"text": "see old", "attachments": [old["id"]]}), 404, "not_found")
    assert_error(web.user.delete(f"/api/conversations/{conversation_id}/attachments/{old['id']}"), 404, "not_found")
    sent = send(web.user, conversation_id, {"text": "see this", "attachments": [fresh["id"]]})
    assert sent.status_code == 202, sent.text
    shown = sent.json()["message"]["attachments"]
    assert [(a["id"], a["state"], a["messageId"]) for a in shown] == [
        (fresh["id"], "attached", sent.json()["message"]["id"])
    ]
    assert_error(web.user.delete(f"/api/conversations/{conversation_id}/attachments/{fresh['id']}"), 409,
                 "attachment_used")  # fmt: skip
    web.user.post(f"/api/conversations/{conversation_id}/turns/{sent.json()['turn']['id']}/stop")
    again = send(web.user, conversation_id, {"text": "again", "attachments": [fresh["id"]]})
    assert_error(again, 409, "attachment_used")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[HubServer, HermesFixture, httpx.Client]]:
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        runner = None
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner = RunnerProcess(path, tmp_path / "logs", "runner")
            runner.wait_for("runner connected")
            alice = login(server, "alice")
            yield server, hermes, alice
            alice.close()
        finally:
            if runner is not None:
                runner.close()
            server.stop()


def test_a_png_and_a_text_file_reach_hermes_once_and_the_file_s_reference_joins_the_prompt(
    node: tuple[HubServer, HermesFixture, httpx.Client],
) -> None:
    server, hermes, alice = node
    conversation_id = start_chat(alice, make_bot(alice))
    image = uploaded(alice, conversation_id, PNG, "image/png", "shot.png")
    notes = uploaded(alice, conversation_id, b"release notes\n", "text/plain", "notes.txt")
    body = {"text": "now with files", "attachments": [image["id"], notes["id"]]}
    with_files = alice.post(f"/api/conversations/{conversation_id}/turns", json=body)
    assert with_files.status_code == 202, with_files.text
    done = wait_turn(alice, conversation_id, with_files.json()["turn"]["id"])
    assert done["state"] == "completed", done
    got = hermes.attachments()
    assert [(a["kind"], a["bytes"]) for a in got] == [("image", len(PNG)), ("file", len(b"release notes\n"))]
    prompt = next(t.text for t in hermes.turns() if "now with files" in t.text)
    lines = prompt.split("\n")
    assert lines[0] == "now with files" and lines[1].startswith("@file:") and lines[1].endswith("notes.txt")
    stored = next(m for m in messages(alice, conversation_id) if m["content"] == "now with files")
    assert [(a["name"], a["state"]) for a in stored["attachments"]] == [("shot.png", "sent"), ("notes.txt", "sent")]
    conn = sqlite3.connect(server.settings.sqlite_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM chat_attachment WHERE data IS NOT NULL").fetchone() == (0,)
    finally:
        conn.close()
