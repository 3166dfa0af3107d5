"""Helpers of the chat browser tests: names that must resolve to exactly one element, and a page's layout."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from talaria.testing.hub_server import HubServer
from tests.browser.conftest import DESKTOP, PHONE, Browsers, assert_fits, sign_in

SCHEMES = ("light", "dark")


def assert_unique(page: Page, *named: tuple[str, str]) -> None:
    """Each (role, name) resolves to exactly one element under Playwright's case-insensitive substring match
    (chat.md 6.2), and the main navigation starts with Chats and Bots."""
    for role, name in named:
        expect(page.get_by_role(role, name=name), f"{role} {name!r}").to_have_count(1)  # type: ignore[arg-type]
    for role, name in (("link", "Chats"), ("link", "Bots")):
        expect(page.get_by_role(role, name=name), f"{role} {name!r}").to_have_count(1)  # type: ignore[arg-type]
    first = page.get_by_role("navigation", name="Main").get_by_role("link")
    assert first.all_inner_texts()[:2] == ["Chats", "Bots"]


def assert_fits_everywhere(page: Page) -> None:
    """The current page fits a phone and a desktop in the light and the dark scheme."""
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        for size in (PHONE, DESKTOP):
            page.set_viewport_size(size)
            assert_fits(page)
    page.emulate_media(color_scheme="light")
    page.set_viewport_size(DESKTOP)


def open_as(browsers: Browsers, hub: HubServer, path: str, user: str = "alice", **options: object) -> Page:
    """A new watched page, signed in as ``user``, at ``path``."""
    page = browsers.context(**options).page()
    sign_in(page, hub, user)
    page.goto(f"{hub.url}{path}")
    return page
