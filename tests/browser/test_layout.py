"""Every page fits a phone (390x844) and a desktop (1280x800) without sideways scrolling (issue: web UI)."""

from __future__ import annotations

import pytest

from talaria.testing.hub_server import HubServer
from tests.browser.conftest import DESKTOP, PHONE, Browsers, assert_fits, sign_in
from tests.conftest import login


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_every_page_fits_the_screen(hub: HubServer, browsers: Browsers, size: dict[str, int]) -> None:
    alice, root = login(hub, "alice"), login(hub, "root")
    try:
        body = {"title": "A long title " * 8, "prompt": "word " * 300, "cell": "local", "profile": "default"}
        task = alice.post("/api/tasks", json=body).json()["task"]
        assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
        job = root.post(f"/api/tasks/{task['id']}/approve").json()["job"]  # queued: no node serves local
        assert root.post("/api/admin/runners", json={"name": "a-node-with-a-long-name-" * 3,
                                                     "allowedProfiles": ["default"]}).status_code == 201  # fmt: skip
    finally:
        alice.close()
        root.close()
    page = browsers.context(viewport=size).page()
    sign_in(page, hub, "root")
    for path in ("/tasks", f"/tasks/{task['id']}", "/jobs", f"/jobs/{job['id']}", "/audit", "/settings",
                 "/settings/nodes", "/settings/accounts", "/settings/accounts/alice"):  # fmt: skip
        page.goto(f"{hub.url}{path}")
        assert_fits(page)
