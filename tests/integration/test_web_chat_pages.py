"""The chat pages over HTTP (chat.md 6): headers, sign-in redirects, another account's conversation as the 404 page,
the two parts' JSON refusals, and text shown as text. tests/browser drives the same pages in chromium."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login


@pytest.fixture
def hub(make_hub: Callable[..., HubServer]) -> HubServer:
    server = make_hub()
    add_account(server, "root", "admin", allowed_profiles={"local": ["default"]})
    add_account(server, "alice", allowed_profiles={"local": ["default"]})
    add_account(server, "bob", allowed_profiles={"local": ["default"]})
    root = login(server, "root")
    try:
        assert root.post("/api/admin/runners", json={"name": "node", "allowedProfiles": ["default"]}).status_code == 201
    finally:
        root.close()
    return server


def _conversation(client: httpx.Client, text: str) -> tuple[str, str]:
    bot = client.post("/api/bots", json={"name": "Helper <b>", "source": "local", "profile": "default"})
    assert bot.status_code == 201, bot.text
    conversation = client.post("/api/conversations", json={"botId": bot.json()["bot"]["id"]})
    conversation_id: str = conversation.json()["conversation"]["id"]
    sent = client.post(f"/api/conversations/{conversation_id}/turns", json={"text": text})
    assert sent.status_code == 202, sent.text
    message_id: str = sent.json()["message"]["id"]
    return conversation_id, message_id


def test_the_chat_pages_are_html_with_the_strict_policy_and_show_text_as_text(hub: HubServer) -> None:
    alice = login(hub, "alice")
    try:
        conversation_id, message_id = _conversation(alice, "<script>alert(1)</script>\nline two")
        chat = f"/chats/{conversation_id}"
        for path in ("/chats", "/chats?archived=1", "/bots", "/bots?archived=1", chat, f"{chat}/transcript",
                     f"{chat}/messages/{message_id}"):  # fmt: skip
            page = alice.get(path)
            assert page.status_code == 200, (path, page.text)
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert "<script>" not in page.text and " style=" not in page.text, path  # nothing inline
        page = alice.get(f"/chats/{conversation_id}").text
        assert '<script src="/static/chat.js" defer></script>' in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;\nline two" in page
        assert "Helper &lt;b&gt;" in page and "Helper <b>" not in page
        assert 'data-last-event-id="' in page and "Waiting for node node to connect" in page
        fragment = alice.get(f"/chats/{conversation_id}/messages/{message_id}").text
        assert fragment.startswith("<article") and 'aria-labelledby="by-' in fragment
        nav = alice.get("/tasks").text
        assert nav.index('href="/chats"') < nav.index('href="/bots"') < nav.index('href="/tasks"')
    finally:
        alice.close()


def test_without_a_session_the_pages_redirect_and_the_parts_answer_401(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        for path in ("/chats", "/bots", "/chats/cnv_x"):
            answer = anonymous.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"] == "/login?next=" + path.replace("/", "%2F")
        for path in ("/chats/cnv_x/transcript", "/chats/cnv_x/messages/msg_x"):
            answer = anonymous.get(path)
            assert answer.status_code == 401
            assert answer.json() == {"code": "unauthenticated", "error": "sign in first"}


def test_another_account_s_conversation_is_the_404_page_and_its_parts_are_404(hub: HubServer) -> None:
    alice, bob, root = login(hub, "alice"), login(hub, "bob"), login(hub, "root")
    try:
        conversation_id, message_id = _conversation(alice, "private")
        unknown = bob.get("/chats/cnv_01ZZZZZZZZZZZZZZZZZZZZZZZZ")
        assert bob.get(f"/chats/{conversation_id}").text == unknown.text  # the same page as an unknown id
        for client in (bob, root):  # an admin neither (chat.md 2)
            page = client.get(f"/chats/{conversation_id}")
            assert page.status_code == 404 and "There is no page at this address." in page.text
            assert "private" not in page.text
            for part in (f"/chats/{conversation_id}/transcript", f"/chats/{conversation_id}/messages/{message_id}"):
                answer = client.get(part)
                assert answer.status_code == 404 and answer.json()["code"] == "not_found"
        assert alice.get(f"/chats/{conversation_id}/messages/msg_01ZZZZZZZZZZZZZZZZZZZZZZZZ").status_code == 404
        assert alice.get(f"/chats/{conversation_id}?before=not-a-cursor").status_code == 400
    finally:
        for client in (alice, bob, root):
            client.close()
