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


# Every control inside its card, and the vertical gap (px) above each block that follows another one.
SPACING = """() => {
  const out = {escapes: [], gaps: []};
  for (const card of document.querySelectorAll('.card')) {
    const box = card.getBoundingClientRect();
    for (const el of card.querySelectorAll('button, input, select, textarea')) {
      const r = el.getBoundingClientRect();
      const outside = r.right > box.right + 0.5 || r.left < box.left - 0.5;
      if (r.width && outside) out.escapes.push(el.outerHTML.slice(0, 80));
    }
    for (const el of card.querySelectorAll('label, h2, button, input, select, textarea')) {
      let prev = el.previousElementSibling;
      while (prev && !prev.getBoundingClientRect().height) prev = prev.previousElementSibling;
      if (!prev || el.closest('.check') || prev.matches('label')) continue;  // a control right under its label
      const gap = el.getBoundingClientRect().top - prev.getBoundingClientRect().bottom;
      out.gaps.push([el.tagName + ' ' + (el.textContent || el.name || '').trim().slice(0, 30), Math.round(gap)]);
    }
  }
  return out;
}"""


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_task_and_account_pages_keep_their_cards_stacked_and_their_blocks_apart(
    hub: HubServer, browsers: Browsers, size: dict[str, int]
) -> None:
    alice = login(hub, "alice")
    try:
        body = {"title": "Release notes", "prompt": "Summarise them.", "cell": "local", "profile": "default"}
        task = alice.post("/api/tasks", json=body).json()["task"]
        assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
    finally:
        alice.close()
    page = browsers.context(viewport=size).page()
    sign_in(page, hub, "root")
    for path in (f"/tasks/{task['id']}", "/settings/accounts/alice"):
        page.goto(f"{hub.url}{path}")
        found = page.evaluate(SPACING)
        assert found["escapes"] == [], (path, found["escapes"])
        tight = [(what, gap) for what, gap in found["gaps"] if gap < 8]
        assert tight == [], (path, tight)
    page.goto(f"{hub.url}/tasks/{task['id']}")
    state = page.get_by_role("region", name="State").bounding_box()
    actions = page.get_by_role("region", name="Actions").bounding_box()
    assert state is not None and actions is not None
    if size is PHONE:  # one column: the actions come below the state
        assert actions["y"] >= state["y"] + state["height"], (state, actions)
    else:
        assert actions["x"] >= state["x"] + state["width"], (state, actions)
