"""Browser tests (issue: web UI): Playwright for Python driving Debian's ``chromium`` against a real hub on
127.0.0.1. The project's set-up installs chromium (``make browser``); never ``playwright install``. Without the
browser the suite fails saying how to install it (never skipped).

Every page is watched for console errors and uncaught exceptions: a test that sees one fails. Screenshots go to
``build/screenshots`` (or ``$TALARIA_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Playwright, sync_playwright

from talaria.clock import SystemClock
from talaria.hub.timings import HubTimings
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer
from talaria.testing.real_hermes import RealHermes
from tests.conftest import PASSWORD, add_account
from tests.hermes.site_support import Site, running_site

ROOT = Path(__file__).resolve().parents[2]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.browser)


def chromium_path() -> str:
    for candidate in (os.environ.get("TALARIA_CHROMIUM", ""), "/usr/bin/chromium", shutil.which("chromium") or ""):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("Debian's chromium is not installed: run `make browser` (apt-get install chromium) "
                "or set TALARIA_CHROMIUM", pytrace=False)  # fmt: skip


def screenshot_dir() -> Path:
    path = Path(os.environ.get("TALARIA_SCREENSHOT_DIR") or ROOT / "build" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# Package scope, not session: while Playwright's sync API is running, its event loop is the main thread's
# running loop, and every later test that calls asyncio.run() would fail. It stops after the last browser test.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
    try:
        yield launched
    finally:
        launched.close()


@dataclass
class Watched:
    """A browser context whose pages report console errors and uncaught exceptions into ``problems``.

    Chromium logs every refused request ("Failed to load resource: ... 401") as a console error; a test that
    provokes a refusal on purpose names its path with ``expect_refusal`` and only that one is let through."""

    context: BrowserContext
    problems: list[str] = field(default_factory=list)
    refusals: set[str] = field(default_factory=set)

    def expect_refusal(self, path: str) -> None:
        self.refusals.add(path)

    def page(self) -> Page:
        page = self.context.new_page()
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        return page

    def _console(self, message: ConsoleMessage) -> None:
        if message.type not in ("error", "warning"):
            return
        where = urlsplit(message.location.get("url", "")).path
        if message.text.startswith("Failed to load resource") and where in self.refusals:
            return
        self.problems.append(f"console {message.type}: {message.text} ({message.location.get('url', '')})")


@dataclass
class Browsers:
    """Opens watched contexts and, at the end, fails the test if any page saw a console error."""

    browser: Browser
    opened: list[Watched] = field(default_factory=list)

    def context(self, **options: Any) -> Watched:
        watched = Watched(self.browser.new_context(**({"accept_downloads": True, "viewport": DESKTOP} | options)))
        self.opened.append(watched)
        return watched

    def problems(self) -> list[str]:
        return [problem for watched in self.opened for problem in watched.problems]

    def close(self) -> None:
        for watched in self.opened:
            watched.context.close()


@pytest.fixture
def browsers(browser: Browser) -> Iterator[Browsers]:
    made = Browsers(browser)
    try:
        yield made
        assert made.problems() == [], made.problems()
    finally:
        made.close()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    server = HubServer(tmp_path / "data", SystemClock()).start()
    add_account(server, "root", "admin", allowed_profiles={"local": ["default"]})
    add_account(server, "alice", allowed_profiles={"local": ["default"]})
    add_account(server, "bob", "admin", allowed_profiles={"local": ["default"]})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chat_hub(tmp_path: Path) -> Iterator[HubServer]:
    """A hub for the chat pages: alice may use ``default`` and ``work`` on ``local`` (chat.md 9), bob ``default``;
    a stream's keepalive (and so its session check) comes after 0.5 s of silence."""
    server = HubServer(tmp_path / "data", SystemClock(), timings=HubTimings(chat_keepalive_s=0.5)).start()
    add_account(server, "root", "admin", allowed_profiles={"local": ["default"]})
    add_account(server, "alice", allowed_profiles={"local": ["default", "work"]})
    add_account(server, "bob", allowed_profiles={"local": ["default"]})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chat_site(tmp_path: Path, model: ModelServer, hermes_executable: Path) -> Iterator[Site]:
    """The chat pages over processes (chat.md 9): a ``talaria hub`` process, a runner process in front of a real
    Hermes (profiles ``default`` and ``work``) driven by ``model``, and alice, bob and root signed in as clients
    (tests/hermes/site_support.py). Its streams keep the production keepalive (no setting changes it)."""
    with RealHermes(tmp_path / "hermes", model.base_url, profiles=("work",)) as hermes, \
            running_site(tmp_path, hermes) as site:  # fmt: skip
        yield site


class Served(Protocol):
    """Where a hub serves the pages: an in-thread ``HubServer`` or a ``talaria hub`` process's ``Site``."""

    @property
    def url(self) -> str: ...


def sign_in(page: Page, hub: Served, username: str, password: str = PASSWORD) -> None:
    page.goto(f"{hub.url}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{hub.url}/tasks")


def assert_fits(page: Page) -> None:
    """Nothing sticks out sideways: the page scrolls only vertically at the current viewport width."""
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px viewport"
