"""Attachments on a real Hermes (chat.md 3.4, 5.4, scenario 11): a ``talaria hub`` process, a real runner, real
``hermes serve`` 0.19.0 and the scripted model (declared vision-capable, so Hermes passes images natively). Alice
uploads a PNG and a text file and sends a turn with both: Hermes stages the image and puts it into the model's request
as an ``image_url`` content part (a data URL of the same bytes); it stages the file in the session's workspace and
expands the ``@file:`` line Talaria put in the prompt into an ``Attached Context`` block holding the file's content.
11 MiB is 413 ``attachment_too_large``, a zip 415 ``attachment_kind_unsupported``. After a node switch the carry-over
transcript names both attachments as absent, and the new session's request has no image part and no old node path."""

from __future__ import annotations

import base64
import sqlite3
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx

from talaria.testing.model_server import LoggedRequest, ModelServer, reply, when
from tests.hermes.chat_support import (
    assert_text_kept_out,
    audit_verifies,
    make_bot,
    messages,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.site_support import Site
from tests.integration.web_support import assert_error

ASKED = "please look at the shot and the notes"
NOTES = b"the quarterly figures stay confidential\n"
REPLIED = "Both files were looked at."
STAGED_REF = "@file:.hermes/desktop-attachments/notes.txt"  # Hermes' ref_text for notes.txt in the session workspace


def png() -> bytes:
    """A valid 1x1 RGB PNG (signature, IHDR, IDAT, IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def upload(client: httpx.Client, conversation_id: str, data: bytes, media_type: str, name: str) -> httpx.Response:
    return client.post(f"/api/conversations/{conversation_id}/attachments", content=data, params={"name": name},
                       headers={"Content-Type": media_type})  # fmt: skip


def uploaded(client: httpx.Client, conversation_id: str, data: bytes, media_type: str, name: str) -> str:
    answer = upload(client, conversation_id, data, media_type, name)
    assert answer.status_code == 201, answer.text
    attachment_id: str = answer.json()["attachment"]["id"]
    return attachment_id


def send_with_files(site: Site, conversation_id: str) -> str:
    """Upload the PNG and the notes, send ``ASKED`` with both; the completed turn's id."""
    image = uploaded(site.alice, conversation_id, png(), "image/png", "shot.png")
    notes = uploaded(site.alice, conversation_id, NOTES, "text/plain", "notes.txt")
    sent = site.alice.post(f"/api/conversations/{conversation_id}/turns",
                           json={"text": ASKED, "attachments": [image, notes]})  # fmt: skip
    assert sent.status_code == 202, sent.text
    turn_id: str = sent.json()["turn"]["id"]
    done = wait_turn(site.alice, conversation_id, turn_id, timeout=180)
    assert done["state"] == "completed", done
    return turn_id


def turn_request(model: ModelServer, turn_id: str) -> LoggedRequest:
    """The model request that started the turn (it offers tools and its last user message holds the marker)."""
    return next(r for r in model.chat_requests() if r.tools and f"[talaria-run:{turn_id}:" in (r.last_user or ""))


def image_parts(request: LoggedRequest) -> list[dict[str, Any]]:
    """Every ``image_url`` content part of every message of the request."""
    return [part for message in request.body["messages"] if isinstance(message.get("content"), list)
            for part in message["content"] if part.get("type") == "image_url"]  # fmt: skip


def stored_attachments(data: Path) -> list[tuple[str, str, str | None, str | None, bool]]:
    """``(name, state, runner_id, node_path, data kept)`` of every attachment row, in upload order."""
    conn = sqlite3.connect(data / "talaria.sqlite3")
    try:
        rows = conn.execute("SELECT name, state, runner_id, node_path, data IS NOT NULL FROM chat_attachment "
                            "ORDER BY created_at, id").fetchall()  # fmt: skip
    finally:
        conn.close()
    return [(str(n), str(s), r, p, bool(d)) for n, s, r, p, d in rows]


def test_a_png_reaches_the_model_as_an_image_part_and_a_text_file_as_its_expanded_file_reference(
    site: Site, model: ModelServer
) -> None:
    model.script(when(ASKED, reply(REPLIED)))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    assert_error(upload(alice, conversation_id, b"x" * (11 * 1024 * 1024), "text/plain", "big.txt"), 413,
                 "attachment_too_large")  # fmt: skip
    assert_error(upload(alice, conversation_id, b"PK\x03\x04zip", "application/zip", "a.zip"), 415,
                 "attachment_kind_unsupported")  # fmt: skip
    turn_id = send_with_files(site, conversation_id)
    marker = f"[talaria-run:{turn_id}:"
    assert model.turn_starts(marker) == 1
    request = turn_request(model, turn_id)
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    assert image_parts(request) == [{"type": "image_url", "image_url": {"url": data_url}}]
    rows = stored_attachments(site.data)
    assert [(n, s, r, d) for n, s, r, _, d in rows] == [("shot.png", "sent", site.runner_id, False),
                                                        ("notes.txt", "sent", site.runner_id, False)]  # fmt: skip
    image_path, notes_path = (Path(str(path)) for _, _, _, path, _ in rows)
    assert image_path.read_bytes() == png() and notes_path.read_bytes() == NOTES  # where Hermes staged them
    assert notes_path.as_posix().endswith(STAGED_REF.removeprefix("@file:"))
    # the prompt as Talaria submitted it (the text, Hermes' ref_text on its own line, the marker) shows in Hermes'
    # title request after the first exchange (it offers no tools); the turn's own request holds it expanded
    submitted = f"User: {ASKED}\n{STAGED_REF}\n{marker}"
    model.wait_for(lambda log: any(not r.tools and submitted in (r.last_user or "") for r in log), timeout=60)
    # what the model got: Hermes replaced the ref by the file's content (and joined the lines), then named the image
    (text,) = [part["text"] for part in request.body["messages"][-1]["content"] if part.get("type") == "text"]
    assert text.startswith(f"{ASKED} {marker}")
    assert f"--- Attached Context ---\n\n📄 {STAGED_REF} (" in text
    assert f"```\n{NOTES.decode()}\n```" in text
    assert text.endswith(f"[Image attached at: {image_path}]")
    stored = next(m for m in messages(alice, conversation_id) if m["content"] == ASKED)
    shown = [(a["name"], a["kind"], a["state"]) for a in stored["attachments"]]
    assert shown == [("shot.png", "image", "sent"), ("notes.txt", "file", "sent")]
    assert audit_verifies(site.data)
    assert_text_kept_out([ASKED, REPLIED, NOTES.decode().strip()], site.data, *site.logs())


def test_after_a_node_switch_the_carry_over_names_the_attachments_absent_and_sends_no_image(
    site: Site, model: ModelServer
) -> None:
    model.script(when("what did I attach", reply("Nothing is here now.")), when(ASKED, reply(REPLIED)))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    first_turn = send_with_files(site, conversation_id)
    assert len(image_parts(turn_request(model, first_turn))) == 1
    old_paths = [str(path) for _, _, _, path, _ in stored_attachments(site.data)]
    new_id = site.switch_node()
    turn_id = send(alice, conversation_id, "what did I attach before?").json()["turn"]["id"]
    done = wait_turn(alice, conversation_id, turn_id, timeout=180)
    assert done["state"] == "completed" and done["carry"] == "node-changed" and done["runnerId"] == new_id, done
    assert model.turn_starts(f"[talaria-run:{turn_id}:") == 1 and model.turn_starts(f"[talaria-run:{first_turn}:") == 1
    request = turn_request(model, turn_id)
    assert image_parts(request) == []
    prompt = request.last_user or ""
    transcript = prompt[prompt.index("[talaria-transcript]") : prompt.index("[/talaria-transcript]")]
    assert (f"User: {ASKED}\n"
            '(attachment "shot.png" was on the previous node and is not here)\n'
            '(attachment "notes.txt" was on the previous node and is not here)\n'
            f"\nAssistant: {REPLIED}\n") in transcript  # fmt: skip
    assert "@file:" not in prompt and "Attached Context" not in prompt
    assert not any(path in prompt for path in old_paths)
    assert audit_verifies(site.data)
    texts = [ASKED, REPLIED, NOTES.decode().strip(), "what did I attach before?", "Nothing is here now."]
    assert_text_kept_out(texts, site.data, *site.logs())


def test_file_names_that_look_like_paths_stay_in_the_session_s_staging_directory(
    site: Site, model: ModelServer
) -> None:
    """Issue 17 part 4: a name cannot carry ``/`` or ``\\`` (400), and what it can carry (dots, encoded slashes, a
    leading dot) is only a name: Hermes stages every such file in the session's desktop-attachments directory."""
    model.script(when("hostile names", reply("staged")))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    for name in ("../escape.txt", "..\\escape.txt", "/etc/escape.txt"):
        assert_error(upload(alice, conversation_id, b"x", "text/plain", name), 400, "invalid_request")
    names = ["..", "%2e%2e%2f..%2fescape.txt", "..%2F..%2Fescape.txt", ".env"]  # at most 4 in a message
    ids = [uploaded(alice, conversation_id, f"body {i}\n".encode(), "text/plain", n) for i, n in enumerate(names)]
    sent = alice.post(f"/api/conversations/{conversation_id}/turns", json={"text": "hostile names", "attachments": ids})
    assert sent.status_code == 202, sent.text
    done = wait_turn(alice, conversation_id, sent.json()["turn"]["id"], timeout=180)
    assert done["state"] == "completed", done
    rows = stored_attachments(site.data)
    assert [(n, s) for n, s, _, _, _ in rows] == [(n, "sent") for n in names]
    staged = [Path(str(path)) for _, _, _, path, _ in rows]
    staging = staged[0].parent
    assert staging.name == "desktop-attachments" and staging.parent.name == ".hermes", staged
    for i, path in enumerate(staged):
        assert path.parent == staging and path.resolve().parent == staging.resolve(), path
        assert path.read_bytes() == f"body {i}\n".encode()
    assert not list(staging.parent.parent.parent.rglob("escape.txt")), "no file escaped under its encoded name"
