"""The chat pages without a Hermes turn (chat.md 6): bots and chats lists, a conversation's controls, its turn
waiting for an offline node and stopped, refusals in the alerts, the stream's reset and end, and the layout."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Route, expect

from talaria.testing.hub_server import HubServer
from tests.browser.chat_support import assert_fits_everywhere, assert_unique, open_as
from tests.browser.conftest import DESKTOP, PHONE, Browsers, sign_in
from tests.conftest import login
from tests.hermes.chat_support import make_bot, start_chat


@pytest.fixture
def alice(chat_hub: HubServer) -> Iterator[httpx.Client]:
    client = login(chat_hub, "alice")
    try:
        yield client
    finally:
        client.close()


def _register_offline_node(hub: HubServer) -> None:
    """An enabled runner record for ``local`` that never connects: bots may be made, turns wait for it."""
    root = login(hub, "root")
    try:
        made = root.post("/api/admin/runners", json={"name": "node", "allowedProfiles": ["default", "work"]})
        assert made.status_code == 201, made.text
    finally:
        root.close()


def test_without_a_node_there_is_no_profile_and_without_a_bot_no_chat(chat_hub: HubServer, browsers: Browsers) -> None:
    page = open_as(browsers, chat_hub, "/bots")
    expect(page.get_by_role("heading", name="Bots", exact=True)).to_be_visible()
    expect(page.get_by_text("No profile is available to you.")).to_be_visible()
    expect(page.get_by_role("button", name="Create bot")).to_be_disabled()
    page.get_by_role("link", name="Chats").click()
    expect(page.get_by_role("heading", name="Chats", exact=True)).to_be_visible()
    expect(page.get_by_text("Create a bot to start chatting.")).to_be_visible()
    expect(page.get_by_role("button", name="New chat")).to_be_disabled()


def test_bots_are_made_archived_and_unarchived_by_name_and_a_chat_starts_with_the_chosen_bot(
    chat_hub: HubServer, browsers: Browsers
) -> None:
    _register_offline_node(chat_hub)
    watched = browsers.context()
    watched.expect_refusal("/api/bots")
    page = watched.page()
    sign_in(page, chat_hub, "alice")
    page.goto(f"{chat_hub.url}/bots")
    form = page.get_by_role("form", name="Create a bot")
    expect(form.get_by_role("combobox", name="Profile").locator("option")).to_have_text(
        ["default on local", "work on local"]
    )
    for name, profile in (("Writer", "work on local"), ("Assistant", "default on local")):
        form.get_by_role("textbox", name="Name").fill(name)
        form.get_by_role("combobox", name="Profile").select_option(label=profile)
        form.get_by_role("button", name="Create bot").click()
        expect(page.get_by_role("link", name=f"Chat with {name}")).to_be_visible()
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("Assistant")  # by name
    expect(rows.nth(1)).to_contain_text("work on local")
    assert_unique(page, ("form", "Create a bot"), ("textbox", "Name"), ("combobox", "Profile"),
                  ("textbox", "Instructions"), ("button", "Create bot"), ("link", "Chat with Writer"),
                  ("button", "Archive Writer"), ("navigation", "Filter bots"))  # fmt: skip
    form.get_by_role("textbox", name="Name").fill("  WRITER ")
    form.get_by_role("button", name="Create bot").click()
    expect(form.get_by_role("alert")).to_have_text(re.compile(r".+ \[duplicate_bot_name\]$"))

    page.get_by_role("button", name="Archive Assistant").click()
    expect(page.get_by_role("link", name="Chat with Assistant")).to_have_count(0)
    page.get_by_role("navigation", name="Filter bots").get_by_role("link", name="Archived").click()
    expect(page.get_by_role("button", name="Unarchive Assistant")).to_be_visible()
    expect(page.get_by_role("button", name="Archive Assistant", exact=True)).to_have_count(0)
    expect(page.get_by_role("link", name="Chat with Assistant")).to_have_count(0)
    page.get_by_role("button", name="Unarchive Assistant").click()
    expect(page.get_by_role("button", name="Unarchive Assistant")).to_have_count(0)
    page.get_by_role("navigation", name="Filter bots").get_by_role("link", name="Active").click()

    page.get_by_role("link", name="Chat with Writer").click()
    expect(page).to_have_url(re.compile(r"/chats\?bot=bot_[0-9A-Z]+$"))
    chooser = page.get_by_role("combobox", name="Bot")
    expect(chooser.locator("option:checked")).to_have_text("Writer (offline)")
    expect(chooser.locator("option")).to_have_text(["Assistant (offline)", "Writer (offline)"])
    assert_unique(page, ("combobox", "Bot"), ("button", "New chat"), ("navigation", "Filter chats"))
    page.get_by_role("button", name="New chat").click()
    expect(page).to_have_url(re.compile(r"/chats/cnv_[0-9A-Z]+$"))
    expect(page.get_by_role("heading", name="Untitled chat")).to_be_visible()
    page.get_by_role("link", name="All conversations").click()
    expect(page.get_by_role("link", name="Untitled chat")).to_be_visible()
    expect(page.locator("table.list tbody tr")).to_contain_text(["Writer"])


def test_a_turn_waits_for_its_node_and_stops_and_the_page_is_renamed_and_archived(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    bot_id = make_bot(alice, "Writer", profile="work")
    conversation_id = start_chat(alice, bot_id)
    watched = browsers.context()
    uploads = f"/api/conversations/{conversation_id}/attachments"
    watched.expect_refusal(uploads)
    page = watched.page()
    sign_in(page, chat_hub, "alice")
    page.goto(f"{chat_hub.url}/chats/{conversation_id}")
    status = page.get_by_role("status")
    message = page.get_by_role("textbox", name="Message")
    send, stop = page.get_by_role("button", name="Send"), page.get_by_role("button", name="Stop")
    expect(stop).to_be_hidden()
    message.fill("first line\nsecond line")
    message.press("Enter")  # a new line, not a send
    expect(message).to_have_value("first line\nsecond line\n")
    message.press("Control+Enter")
    expect(message).to_have_value("")
    expect(message).to_be_focused()
    mine = page.get_by_role("log", name="Messages").get_by_role("article", name="You")
    expect(mine).to_have_count(1)
    expect(mine.locator(".body")).to_have_text("first line second line")
    # plain text, line breaks kept (the article may be swapped for the stored one meanwhile: the style is polled)
    expect(mine.locator(".body")).to_have_css("white-space", "pre-wrap")
    assert mine.locator(".body").evaluate("e => e.textContent") == "first line\nsecond line\n"
    expect(status).to_have_text("Waiting for node node to connect")
    expect(send).to_be_disabled()
    expect(stop).to_be_visible()
    expect(page.get_by_role("heading", name="first line")).to_be_visible()  # titled by the first message
    assert_unique(page, ("log", "Messages"), ("textbox", "Message"), ("button", "Send"), ("button", "Stop"),
                  ("link", "All conversations"), ("button", "Rename"))  # fmt: skip
    expect(page.get_by_label("Attach files")).to_have_count(1)

    page.reload()  # the live turn survives a reload: Send disabled, Stop shown
    expect(status).to_have_text("Waiting for node node to connect")
    expect(send).to_be_disabled()
    expect(stop).to_be_visible()
    stop.click()
    expect(status).to_have_text("Stopped")
    expect(stop).to_be_hidden()
    expect(send).to_be_enabled()
    page.reload()
    expect(status).to_have_text("Stopped")

    page.get_by_label("Attach files").set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"some notes"}]
    )
    # Without the upload route (main before chat.md 3.4) the refusal shows in the composer's alert; with it, the file
    # is a pending attachment until Send, and Remove deletes it.
    composer = page.get_by_role("form", name="Write to Writer")
    refused = composer.get_by_role("alert").filter(has_text=re.compile(r" \[(not_found|method_not_allowed)\]$"))
    remove = composer.get_by_role("button", name="Remove notes.txt")
    expect(refused.or_(remove)).to_be_visible()
    if remove.count():
        remove.click()
        expect(remove).to_have_count(0)
        expect(message).to_be_focused()

    page.get_by_role("button", name="Rename").click()
    title = page.get_by_role("textbox", name="Title")
    expect(title).to_be_focused()
    title.fill("Release plan")
    page.get_by_role("button", name="Save title").click()
    expect(page.get_by_role("heading", name="Release plan")).to_be_visible()

    page.get_by_role("button", name="Archive", exact=True).click()
    expect(page.get_by_text("This chat is archived.")).to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_have_count(0)
    page.get_by_role("button", name="Unarchive").click()
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    assert alice.patch(f"/api/bots/{bot_id}", json={"archived": True}).status_code == 200
    page.reload()
    expect(page.get_by_text("This bot is archived.")).to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_have_count(0)


def test_an_unknown_or_another_account_s_conversation_is_the_404_page(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    watched = browsers.context()
    page = watched.page()
    sign_in(page, chat_hub, "bob")
    for path in (f"/chats/{conversation_id}", "/chats/cnv_01ZZZZZZZZZZZZZZZZZZZZZZZZ"):
        watched.expect_refusal(path)
        answer = page.goto(f"{chat_hub.url}{path}")
        assert answer is not None and answer.status == 404
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        expect(page.get_by_text("There is no page at this address.")).to_be_visible()


def test_a_stream_reset_reloads_the_transcript_and_the_page_follows_on(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    """The page claims an event id the hub never issued: the stream answers ``stream.reset`` and the script
    fetches the snapshot again and reopens the stream after its id (chat.md 4.2, 4.4)."""
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    page = open_as(browsers, chat_hub, "/chats")

    def too_far(route: Route) -> None:
        answer = route.fetch()
        body = re.sub(r'data-last-event-id="\d+"', 'data-last-event-id="999999"', answer.text())
        route.fulfill(response=answer, body=body)

    page.route(f"**/chats/{conversation_id}", too_far)
    with page.expect_response(lambda r: r.url.endswith(f"/chats/{conversation_id}/transcript")) as fetched:
        page.goto(f"{chat_hub.url}/chats/{conversation_id}")
    assert fetched.value.status == 200
    assert page.locator(".chat-snapshot").get_attribute("data-last-event-id") != "999999"
    sent = alice.post(f"/api/conversations/{conversation_id}/turns", json={"text": "sent from elsewhere"})
    assert sent.status_code == 202, sent.text
    expect(page.get_by_role("article", name="You")).to_have_text(re.compile("sent from elsewhere"))
    expect(page.get_by_role("status")).to_have_text("Waiting for node node to connect")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    assert alice.patch(f"/api/conversations/{conversation_id}", json={"title": "Renamed elsewhere"}).status_code == 200
    expect(page.get_by_role("heading", name="Renamed elsewhere")).to_be_visible()


def test_signing_out_elsewhere_ends_the_live_updates_with_a_notice(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    watched = browsers.context()
    for path in (f"/api/conversations/{conversation_id}/events", f"/chats/{conversation_id}/transcript"):
        watched.expect_refusal(path)
    page = watched.page()
    sign_in(page, chat_hub, "alice")
    page.goto(f"{chat_hub.url}/chats/{conversation_id}")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    other = watched.page()
    other.goto(f"{chat_hub.url}/chats")
    other.get_by_role("button", name="Sign out").click()
    other.wait_for_url(re.compile(r"/login$"))
    expect(page.get_by_role("alert").filter(has_text="Your session has ended.")).to_be_visible(timeout=15_000)


def test_the_chat_pages_fit_every_screen_and_a_phone_keeps_the_composer_at_the_bottom(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    bot_id = make_bot(alice, "A bot with a rather long name for a small screen", profile="work")
    conversation_id = start_chat(alice, bot_id)
    text = "A long first line that titles the conversation and goes on and on " * 3 + "\n" + "word " * 1500
    assert alice.post(f"/api/conversations/{conversation_id}/turns", json={"text": text}).status_code == 202
    page = open_as(browsers, chat_hub, "/bots")
    for path in ("/bots", "/bots?archived=1", "/chats", "/chats?archived=1", f"/chats/{conversation_id}"):
        page.goto(f"{chat_hub.url}{path}")
        assert_fits_everywhere(page)
    page.set_viewport_size(PHONE)
    page.evaluate("window.scrollTo(0, 0)")
    composer = page.get_by_role("form", name=re.compile("^Write to"))
    box = composer.bounding_box()
    area = page.locator(".composer-area").bounding_box()
    assert box is not None and area is not None
    assert PHONE["height"] - 2 <= area["y"] + area["height"] <= PHONE["height"] + 1, area  # pinned to the bottom
    page.set_viewport_size(DESKTOP)
    log = page.get_by_role("log", name="Messages").bounding_box()
    assert log is not None and log["width"] <= 48 * 16, log


def test_a_long_conversation_links_to_its_older_messages(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    turns = f"/api/conversations/{conversation_id}/turns"
    for n in range(1, 53):  # each turn stopped while it waits for the node: one user message each
        sent = alice.post(turns, json={"text": f"message {n}"})
        assert sent.status_code == 202, sent.text
        assert alice.post(f"{turns}/{sent.json()['turn']['id']}/stop").status_code == 202
    page = open_as(browsers, chat_hub, f"/chats/{conversation_id}")
    articles = page.get_by_role("log", name="Messages").get_by_role("article")
    expect(articles).to_have_count(50)
    expect(articles.first.locator(".body")).to_have_text("message 3")
    expect(articles.last.locator(".body")).to_have_text("message 52")
    expect(page.get_by_role("status")).to_have_text("Stopped")
    page.get_by_role("link", name="Older messages").click()
    expect(articles).to_have_count(2)
    expect(articles.first.locator(".body")).to_have_text("message 1")
    expect(page.get_by_role("link", name="Older messages")).to_have_count(0)
    expect(page.get_by_role("textbox", name="Message")).to_have_count(0)  # an older page only reads
    page.get_by_role("link", name="Back to the newest").click()
    expect(articles).to_have_count(50)
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()


def _sse(events: list[tuple[int, str, dict[str, object]]]) -> str:
    return "".join(f"id: {i}\nevent: {kind}\ndata: {json.dumps(data)}\n\n" for i, kind, data in events)


def test_approval_cards_come_from_the_stream_and_answer_through_the_api(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    """The hub emits no approval events before the approvals route exists: the stream is played by the test, twice
    (the browser reconnects after it ends), so each card is also shown once per id."""
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    sent = alice.post(f"/api/conversations/{conversation_id}/turns", json={"text": "tidy the disk"})
    turn_id = sent.json()["turn"]["id"]
    base = {"turnId": turn_id, "state": "pending", "description": None, "command": None, "question": None,
            "choices": [], "choice": None, "createdAt": 0, "resolvedAt": None}  # fmt: skip
    danger = base | {"id": "apr_1", "kind": "approval", "description": "Delete the cache", "command": "rm -rf ~/.cache"}
    asked = base | {"id": "apr_2", "kind": "clarify", "question": "Which folder?", "choices": ["Downloads", "Music"]}
    done = base | {"id": "apr_3", "kind": "approval", "description": "Reboot", "command": "reboot"}
    c = {"conversationId": conversation_id}
    played = _sse([
        (10**9, "approval.requested", c | {"turnId": turn_id, "approval": danger}),
        (10**9 + 1, "approval.requested", c | {"turnId": turn_id, "approval": asked}),
        (10**9 + 2, "approval.requested", c | {"turnId": turn_id, "approval": done}),
        (10**9 + 3, "approval.resolved", c | {"turnId": turn_id, "approval": done | {"state": "denied"}}),
    ])  # fmt: skip
    watched = browsers.context()
    answers = f"/api/conversations/{conversation_id}/turns/{turn_id}/approvals"
    watched.expect_refusal(answers)
    page = watched.page()
    sign_in(page, chat_hub, "alice")
    stream = {"Content-Type": "text/event-stream"}
    page.route(re.compile(rf"/api/conversations/{conversation_id}/events"),
               lambda route: route.fulfill(status=200, headers=stream, body=played))  # fmt: skip
    page.goto(f"{chat_hub.url}/chats/{conversation_id}")
    needed = page.get_by_role("group", name="Approval needed")
    expect(needed).to_have_count(2)
    expect(needed.first).to_contain_text("rm -rf ~/.cache")
    expect(needed.last).to_contain_text("Denied")
    expect(needed.last.get_by_role("button")).to_have_count(0)
    question = page.get_by_role("group", name="Question from Writer")
    expect(question.get_by_role("button", name="Downloads")).to_be_visible()
    expect(question.get_by_role("textbox", name="Your answer")).to_be_visible()
    expect(question.get_by_role("button", name="Reply")).to_be_visible()
    with page.expect_request(re.compile(rf"/api/conversations/{conversation_id}/events")):
        pass  # the played stream ended: the browser reconnects and gets the same ids again
    expect(page.get_by_role("button", name="Approve")).to_have_count(1)
    expect(page.get_by_role("button", name="Deny")).to_have_count(1)
    with page.expect_request(lambda r: r.url.endswith(answers)) as posted:
        needed.first.get_by_role("button", name="Approve").click()
    assert json.loads(posted.value.post_data or "{}") == {"approvalId": "apr_1", "choice": "once"}
    expect(needed.first.get_by_role("alert")).to_have_text(re.compile(r" \[[a-z_]+\]$"))  # no such approval
    question.get_by_role("textbox", name="Your answer").fill("Downloads, but only old files")
    with page.expect_request(lambda r: r.url.endswith(answers)) as replied:
        question.get_by_role("button", name="Reply").click()
    assert json.loads(replied.value.post_data or "{}") == {"approvalId": "apr_2",
                                                           "answer": "Downloads, but only old files"}  # fmt: skip


def test_the_chat_list_links_to_older_conversations(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    _register_offline_node(chat_hub)
    bot_id = make_bot(alice, "Writer", profile="work")
    made = {f"/chats/{start_chat(alice, bot_id)}" for _ in range(51)}  # one more than a page
    page = open_as(browsers, chat_hub, "/chats")
    links = page.locator("table.list tbody tr a")
    expect(links).to_have_count(50)
    newest = {links.nth(i).get_attribute("href") for i in range(50)}
    page.get_by_role("link", name="Older conversations").click()
    expect(links).to_have_count(1)
    assert newest | {links.first.get_attribute("href")} == made
    expect(page.get_by_role("link", name="Older conversations")).to_have_count(0)
    page.get_by_role("link", name="Back to the newest").click()
    expect(links).to_have_count(50)


def test_a_message_sent_while_the_hub_drains_is_kept_in_the_composer_with_the_reason(
    chat_hub: HubServer, browsers: Browsers, alice: httpx.Client
) -> None:
    """Operations.md 3.4: during a planned restart a new turn is 503 ``hub_draining``; the page says so in the
    composer's alert and keeps the text, and nothing was accepted (the user sends it again after the restart)."""
    _register_offline_node(chat_hub)
    conversation_id = start_chat(alice, make_bot(alice, "Writer", profile="work"))
    watched = browsers.context()
    turns = f"/api/conversations/{conversation_id}/turns"
    watched.expect_refusal(turns)
    page = watched.page()
    sign_in(page, chat_hub, "alice")
    page.goto(f"{chat_hub.url}/chats/{conversation_id}")
    message = page.get_by_role("textbox", name="Message")
    expect(message).to_be_visible()
    chat_hub.hub.begin_drain()
    message.fill("send me after the restart")
    page.get_by_role("button", name="Send").click()
    alert = page.get_by_role("form", name="Write to Writer").get_by_role("alert")
    expect(alert).to_have_text("the hub is restarting; send it again in a moment [hub_draining]")
    expect(message).to_have_value("send me after the restart")
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    expect(page.get_by_role("log", name="Messages").get_by_role("article")).to_have_count(0)
    assert alice.get(f"/api/conversations/{conversation_id}/messages").json()["messages"] == []
