"""Sign-in, sign-out, keyboard-only use and the CSRF/Origin rule, in a real browser (issue: web UI)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import Page, expect

from talaria.testing.hub_server import HubServer
from tests.browser.conftest import Browsers, sign_in
from tests.conftest import PASSWORD, login


def focused_id(page: Page) -> str:
    return str(
        page.evaluate("document.activeElement ? document.activeElement.id || document.activeElement.textContent : ''")
    )


def test_keyboard_only_sign_in_follows_the_labels_in_order(hub: HubServer, browsers: Browsers) -> None:
    page = browsers.context().page()
    page.goto(f"{hub.url}/tasks")  # not signed in: to the sign-in page, and back here afterwards
    expect(page).to_have_url(f"{hub.url}/login?next=%2Ftasks")
    page.keyboard.press("Tab")
    assert focused_id(page) == "username"
    page.keyboard.type("alice")
    page.keyboard.press("Tab")
    assert focused_id(page) == "password"
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Tab")
    assert focused_id(page) == "Sign in"
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{hub.url}/tasks")
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{hub.url}/login")
    page.goto(f"{hub.url}/jobs")
    expect(page).to_have_url(f"{hub.url}/login?next=%2Fjobs")


def test_a_wrong_password_says_so_and_repeated_failures_slow_down(hub: HubServer, browsers: Browsers) -> None:
    watched = browsers.context()
    watched.expect_refusal("/api/auth/login")  # the 401s and the 429 below are the point of this test
    page = watched.page()
    page.goto(f"{hub.url}/login")
    for _ in range(5):
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill("not the password")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("wrong username or password")
    page.get_by_label("Password").fill(PASSWORD)  # even the right password waits now
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("try again later")
    expect(page.get_by_role("alert")).to_contain_text("login_throttled")
    expect(page).to_have_url(f"{hub.url}/login")


def test_a_page_without_admin_rights_says_so(hub: HubServer, browsers: Browsers) -> None:
    watched = browsers.context()
    watched.expect_refusal("/settings/nodes")
    page = watched.page()
    sign_in(page, hub, "alice")
    page.get_by_role("link", name="Settings").click()  # a user's settings: only their own password
    expect(page.get_by_role("heading", name="Your password", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="Execution nodes")).to_have_count(0)
    expect(page.get_by_role("link", name="Accounts")).to_have_count(0)
    page.goto(f"{hub.url}/settings/nodes")
    expect(page.get_by_text("admin_required")).to_be_visible()


@pytest.fixture
def other_site(hub: HubServer) -> Iterator[str]:
    """A page on another origin whose form posts a task to the hub (a cross-site request forgery attempt)."""
    form = (f'<!doctype html><form method="post" action="{hub.url}/api/tasks">'
            '<input name="title" value="forged"><input name="prompt" value="forged">'
            '<input name="cell" value="local"><input name="profile" value="default">'
            '<input name="csrf_token" value="guessed"><button>Send</button></form>')  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = form.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_cross_origin_form_post_is_refused(hub: HubServer, browsers: Browsers, other_site: str) -> None:
    watched = browsers.context()
    page = watched.page()
    sign_in(page, hub, "alice")  # the session cookie is in this browser
    watched.expect_refusal("/api/tasks")
    page.goto(other_site)
    with page.expect_response(f"{hub.url}/api/tasks") as answer:
        page.get_by_role("button", name="Send").click()
    assert answer.value.status == 403
    assert answer.value.json() == {"code": "csrf_failed", "error": "missing or wrong CSRF token or Origin"}
    alice = login(hub, "alice")
    try:
        assert alice.get("/api/tasks").json()["tasks"] == []  # nothing was created
    finally:
        alice.close()
