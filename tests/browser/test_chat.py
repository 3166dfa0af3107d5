"""Chatting in a real browser (chat.md 9, scenarios 1, 2, 13 and 15): a ``talaria hub`` process, a real runner
process in front of a real ``hermes serve`` driven by the scripted model, and chromium on the conversation page.
Each test ends with ``audit verify`` passing and no message text in the audit table or the processes' logs."""

from __future__ import annotations

import re

from playwright.sync_api import Locator, Page, expect

from talaria.testing.model_server import ModelServer, reply, slow, tool_call, when
from tests.browser.chat_support import assert_fits_everywhere, assert_unique
from tests.browser.conftest import DESKTOP, PHONE, Browsers, screenshot_dir, sign_in
from tests.hermes.chat_support import assert_text_kept_out, audit_verifies, make_bot, start_chat
from tests.hermes.site_support import Site

GREETING = (
    "Hello! I am Writer. This reply comes in small pieces, so the page shows it growing while it streams, "
    "and then swaps in the stored message once it is complete."
)

# The streaming draft's text once it has some (the draft is found and read in one step: it may be swapped any time)
DRAFT_TEXT = "() => { const b = document.querySelector('article[aria-busy=true] .body'); return b && b.textContent; }"


def _conversation(browsers: Browsers, site: Site, conversation_id: str) -> Page:
    page = browsers.context().page()
    sign_in(page, site, "alice")
    page.goto(f"{site.url}/chats/{conversation_id}")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    return page


def _last_reply(page: Page) -> Locator:
    return page.get_by_role("log", name="Messages").get_by_role("article", name="Writer").last


def test_writer_is_made_in_the_browser_and_its_replies_stream_into_the_conversation(
    chat_site: Site, browsers: Browsers, model: ModelServer
) -> None:
    model.script(when("hello", slow(GREETING, chunk_delay_s=0.08)),
                 when("use a tool", tool_call("todo", {}), reply("Done: the **list** is made.")))  # fmt: skip
    watched = browsers.context()
    watched.expect_refusal("/api/bots")
    page = watched.page()
    sign_in(page, chat_site, "alice")
    page.get_by_role("link", name="Bots").click()
    form = page.get_by_role("form", name="Create a bot")
    form.get_by_role("textbox", name="Name").fill("Writer")
    form.get_by_role("combobox", name="Profile").select_option(label="work on local")
    form.get_by_role("textbox", name="Instructions").fill("Answer briefly.")
    form.get_by_role("button", name="Create bot").click()
    expect(page.get_by_role("link", name="Chat with Writer")).to_be_visible()
    form.get_by_role("textbox", name="Name").fill("writer")
    form.get_by_role("combobox", name="Profile").select_option(label="work on local")
    form.get_by_role("button", name="Create bot").click()
    expect(form.get_by_role("alert")).to_have_text(re.compile(r".+ \[duplicate_bot_name\]$"))

    page.get_by_role("link", name="Chat with Writer").click()
    expect(page).to_have_url(re.compile(r"/chats\?bot=bot_[0-9A-Z]+$"))
    expect(page.get_by_role("combobox", name="Bot").locator("option:checked")).to_have_text("Writer")
    page.get_by_role("button", name="New chat").click()
    expect(page).to_have_url(re.compile(r"/chats/cnv_[0-9A-Z]+$"))

    message = page.get_by_role("textbox", name="Message")
    send, stop = page.get_by_role("button", name="Send"), page.get_by_role("button", name="Stop")
    message.fill("hello")
    send.click()
    expect(message).to_have_value("")
    expect(message).to_be_focused()
    expect(page.get_by_role("article", name="You")).to_have_text(re.compile("hello"))
    partial = str(page.wait_for_function(DRAFT_TEXT, timeout=60_000).json_value())  # read while it streams
    expect(page.locator("article[aria-busy=true]")).to_have_accessible_name(re.compile("^Writer"))
    expect(send).to_be_disabled()
    expect(stop).to_be_visible()
    expect(page.get_by_role("status")).to_have_text("Working…")
    answer = _last_reply(page)
    expect(answer).not_to_have_attribute("aria-busy", "true", timeout=60_000)
    expect(answer.locator(".body")).to_have_text(GREETING)
    assert partial and GREETING.startswith(partial) and partial != GREETING, partial  # it grew in place
    expect(page.get_by_role("status")).to_have_text("")
    expect(send).to_be_enabled()
    expect(stop).to_be_hidden()
    first = [r.last_user or "" for r in model.chat_requests() if r.tools and "hello" in (r.last_user or "")]
    assert len(first) == 1  # seen once (a title request without tools may quote it too)
    assert first[0].split("\n")[:4] == ["[talaria-bot-instructions]", "Answer briefly.", "[/talaria-bot-instructions]",
                                        "hello"]  # fmt: skip

    message.fill("please use a tool")
    message.press("Control+Enter")
    tool = page.get_by_role("article", name="Writer used todo")
    expect(tool).to_have_count(1, timeout=60_000)
    expect(_last_reply(page).locator(".body strong")).to_have_text("list", timeout=60_000)
    expect(send).to_be_enabled()
    resumed = [r.last_user or "" for r in model.chat_requests() if r.tools and "please use" in (r.last_user or "")]
    assert resumed and "[talaria-bot-instructions]" not in resumed[0]
    assert_unique(page, ("log", "Messages"), ("textbox", "Message"), ("button", "Send"), ("link", "All conversations"),
                  ("heading", "hello"))  # fmt: skip
    expect(page.get_by_role("status")).to_have_count(1)

    page.reload()  # the stored transcript shows the same articles
    names = page.get_by_role("log", name="Messages").get_by_role("article")
    expect(names).to_have_count(5)
    labels = [n.get_attribute("aria-labelledby") or "" for n in names.all()]
    assert [page.locator(f"[id='{label}']").inner_text() for label in labels] == [
        "You", "Writer", "You", "Writer used todo", "Writer"]  # fmt: skip
    for name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        page.screenshot(path=screenshot_dir() / f"chat-{name}.png")
    assert audit_verifies(chat_site.data)
    said = ["please use a tool", GREETING, "Done: the **list** is made.", "Answer briefly."]
    assert_text_kept_out(said, chat_site.data, *chat_site.logs())


def test_a_page_reloaded_mid_turn_resumes_the_draft_and_ends_like_a_page_never_reloaded(
    chat_site: Site, browsers: Browsers, model: ModelServer
) -> None:
    essay = " ".join(f"Sentence {n} of an essay that streams for a while." for n in range(1, 13))
    model.script(when("an essay", slow(essay, chunk_delay_s=0.05)))
    conversation_id = start_chat(chat_site.alice, make_bot(chat_site.alice, "Writer", profile="work"))
    still = _conversation(browsers, chat_site, conversation_id)
    moved = _conversation(browsers, chat_site, conversation_id)
    still.get_by_role("textbox", name="Message").fill("an essay, please")
    still.get_by_role("button", name="Send").click()
    growing = "t => { const b = document.querySelector('article[aria-busy=true] .body'); " \
              "return b !== null && b.textContent.length > 40 && t.startsWith(b.textContent); }"  # fmt: skip
    moved.wait_for_function(growing, arg=essay, timeout=60_000)
    moved.reload()
    shown = len(str(moved.wait_for_function(DRAFT_TEXT).json_value()))  # the snapshot's draft, then the stream's
    resumes = "([t, n]) => { const b = document.querySelector('article[aria-busy=true] .body'); " \
              "return b === null || (b.textContent.length > n && t.startsWith(b.textContent)); }"  # fmt: skip
    moved.wait_for_function(resumes, arg=[essay, shown], timeout=60_000)  # each delta once, in order
    expect(moved.get_by_role("button", name="Stop")).to_be_visible()
    for page in (still, moved):
        expect(_last_reply(page)).not_to_have_attribute("aria-busy", "true", timeout=60_000)
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
    expect(_last_reply(moved).locator(".body")).to_have_text(essay)
    assert _last_reply(moved).evaluate("a => a.outerHTML") == _last_reply(still).evaluate("a => a.outerHTML")
    assert model.turn_starts("an essay, please") == 1
    assert audit_verifies(chat_site.data)
    assert_text_kept_out(["an essay, please", essay], chat_site.data, *chat_site.logs())


XSS_REPLY = (
    'Look: <img src=x onerror="window.__pwned = 1"> and <script>window.__pwned = 2</script> and '
    "[a trap](javascript:window.__pwned=3) and [the docs](https://example.com/docs).\n\n"
    "```python\nprint('a fenced block whose line is long enough to scroll inside its own box instead of widening "
    "the whole page on a phone')\n```\n"
)


def test_html_and_script_in_a_reply_show_as_text_and_the_conversation_fits_every_screen(
    chat_site: Site, browsers: Browsers, model: ModelServer
) -> None:
    model.script(when("show me", slow(XSS_REPLY, chunk_delay_s=0.01)))
    conversation_id = start_chat(chat_site.alice, make_bot(chat_site.alice, "Writer", profile="work"))
    page = _conversation(browsers, chat_site, conversation_id)
    page.get_by_role("textbox", name="Message").fill('show me <img src=x onerror="window.__pwned = 4"> as text')
    page.get_by_role("button", name="Send").click()
    answer = _last_reply(page)
    expect(answer.locator("pre code.language-python")).to_contain_text("print('a fenced block", timeout=60_000)
    expect(answer).not_to_have_attribute("aria-busy", "true")
    log = page.get_by_role("log", name="Messages")
    expect(log.locator("img, script, iframe, object")).to_have_count(0)
    expect(log.get_by_role("article", name="You")).to_contain_text('<img src=x onerror="window.__pwned = 4">')
    expect(answer).to_contain_text('<img src=x onerror="window.__pwned = 1">')
    expect(answer).to_contain_text("<script>window.__pwned = 2</script>")
    expect(answer).to_contain_text("[a trap](javascript:window.__pwned=3)")
    expect(page.locator("a[href^='javascript' i]")).to_have_count(0)
    docs = answer.get_by_role("link", name="the docs")
    expect(docs).to_have_attribute("href", "https://example.com/docs")
    expect(docs).to_have_attribute("rel", "noopener noreferrer nofollow")
    assert page.evaluate("window.__pwned") is None
    page.reload()  # the stored article renders the same way
    expect(log.locator("img, script")).to_have_count(0)
    expect(_last_reply(page).locator("pre code.language-python")).to_have_count(1)
    assert page.evaluate("window.__pwned") is None
    assert_unique(page, ("log", "Messages"), ("textbox", "Message"), ("button", "Send"), ("button", "Rename"),
                  ("button", "Archive"), ("link", "All conversations"))  # fmt: skip
    assert_fits_everywhere(page)
    for path in ("/chats", "/bots"):
        page.goto(f"{chat_site.url}{path}")
        assert_fits_everywhere(page)
    assert audit_verifies(chat_site.data)
    said = ['show me <img src=x onerror="window.__pwned = 4"> as text', "<script>window.__pwned = 2</script>"]
    assert_text_kept_out(said, chat_site.data, *chat_site.logs())
