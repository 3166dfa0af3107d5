"""Approval cards in a real browser from a real Hermes (chat.md 9, scenario 5): the scripted model calls Hermes'
``terminal`` tool with a dangerous command and its ``clarify`` tool; ``hermes serve`` asks, the hub shows the card
(``Approval needed``, ``Question from Helper``), and the card's buttons answer it (chat.md 6.2's names only). Over
processes: a ``talaria hub``, a real runner and real ``hermes serve``; it ends with ``audit verify`` passing and no
message text in the audit table or the processes' logs."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, expect

from talaria.testing.model_server import ModelServer, reply_with_tool_result, tool_call, when
from tests.browser.conftest import Browsers, sign_in
from tests.hermes.chat_support import assert_text_kept_out, audit_verifies, make_bot, start_chat
from tests.hermes.site_support import Site

WAIT_MS = 120_000  # Hermes builds its agent first; under load that takes a while


def _say(page: Page, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send").click()


def _turn_over(page: Page, replies: int) -> None:
    """The turn ended: ``replies`` stored replies of Helper, and the page lets the next message go."""
    transcript = page.get_by_role("log", name="Messages")
    expect(transcript.get_by_role("article", name=re.compile("^Helper$"))).to_have_count(replies, timeout=WAIT_MS)
    expect(page.get_by_role("button", name="Send")).to_be_enabled(timeout=WAIT_MS)


def test_real_hermes_asks_and_the_cards_approve_deny_and_answer(
    chat_site: Site, browsers: Browsers, model: ModelServer, tmp_path: Path
) -> None:
    kept, removed = tmp_path / "scratch-kept", tmp_path / "scratch-removed"
    kept.mkdir()
    removed.mkdir()
    question = "Which colour should the banner be?"
    model.script(
        when("remove the first", tool_call("terminal", {"command": f"rm -rf {removed}"}), reply_with_tool_result("")),
        when("remove the second", tool_call("terminal", {"command": f"rm -rf {kept}"}), reply_with_tool_result("")),
        when("banner", tool_call("clarify", {"question": question, "choices": ["teal", "amber"]}),
             reply_with_tool_result("Noted: ")),
    )  # fmt: skip
    conversation_id = start_chat(chat_site.alice, make_bot(chat_site.alice, "Helper"))
    page = browsers.context().page()
    sign_in(page, chat_site, "alice")
    page.goto(f"{chat_site.url}/chats/{conversation_id}")

    _say(page, "remove the first scratch directory")
    needed = page.get_by_role("group", name="Approval needed")
    expect(needed).to_have_count(1, timeout=WAIT_MS)
    expect(needed).to_contain_text(f"rm -rf {removed}")
    assert removed.is_dir(), "the command ran before it was approved"
    needed.get_by_role("button", name="Approve").click()
    expect(needed).to_contain_text("Approved")
    expect(needed.get_by_role("button")).to_have_count(0)
    _turn_over(page, 1)
    assert not removed.exists(), "the approved command did not run"
    expect(page.get_by_role("article", name=re.compile("^Talaria"))).to_have_count(1)

    _say(page, "remove the second scratch directory")
    expect(needed).to_have_count(2, timeout=WAIT_MS)
    needed.last.get_by_role("button", name="Deny").click()
    expect(needed.last).to_contain_text("Denied")
    _turn_over(page, 2)
    assert kept.is_dir(), "the denied command ran"
    expect(page.get_by_role("article", name=re.compile("^Helper$")).last).to_contain_text("BLOCKED")

    asked = page.get_by_role("group", name="Question from Helper")
    _say(page, "pick the banner colour")
    expect(asked).to_have_count(1, timeout=WAIT_MS)
    expect(asked).to_contain_text(question)
    asked.get_by_role("button", name="amber").click()
    expect(asked).to_contain_text("Answered")
    _turn_over(page, 3)
    expect(page.get_by_role("article", name=re.compile("^Helper$")).last).to_contain_text('"user_response": "amber"')

    _say(page, "name another banner colour")
    expect(asked).to_have_count(2, timeout=WAIT_MS)
    asked.last.get_by_role("textbox", name="Your answer").fill("a deep forest green")
    asked.last.get_by_role("button", name="Reply").click()
    expect(asked.last).to_contain_text("Answered")
    _turn_over(page, 4)
    expect(page.get_by_role("article", name=re.compile("^Helper$")).last).to_contain_text("a deep forest green")
    expect(page.get_by_role("article", name=re.compile("^Talaria"))).to_have_count(4)
    for text in ("remove the first", "remove the second", "pick the banner", "name another banner"):
        assert model.turn_starts(text) == 1, text
    assert audit_verifies(chat_site.data)
    said = ["remove the first scratch directory", "remove the second scratch directory", "pick the banner colour",
            "name another banner colour", f"rm -rf {removed}", f"rm -rf {kept}", question,
            "a deep forest green"]  # fmt: skip
    assert_text_kept_out(said, chat_site.data, *chat_site.logs())
