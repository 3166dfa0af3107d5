"""The web pages over HTTP (issue: web UI): headers, sign-in redirects, admin-only pages, escaping, live parts.
The browser tests (tests/browser) drive the same pages in chromium."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import httpx
import pytest

from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.runner_support import register_node

PAGES = ["/tasks", "/jobs", "/audit", "/settings", "/settings/nodes", "/settings/accounts", "/settings/accounts/alice",
         "/settings/password"]  # fmt: skip


@pytest.fixture
def hub(runtime_hub: HubServer) -> HubServer:
    add_account(runtime_hub, "root", "admin", allowed_profiles={"local": ["default"]})
    add_account(runtime_hub, "alice", allowed_profiles={"local": ["default"]})
    add_account(runtime_hub, "mallory", tenant="other", allowed_profiles={"local": ["default"]})
    return runtime_hub


def test_every_page_is_html_with_a_strict_content_security_policy(hub: HubServer) -> None:
    root = login(hub, "root")
    try:
        for path in PAGES:
            page = root.get(path)
            assert page.status_code == 200, (path, page.text)
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
            assert page.headers["cache-control"] == "no-store"
            assert page.headers["x-content-type-options"] == "nosniff"
            assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
            assert f'<meta name="csrf-token" content="{root.headers["X-CSRF-Token"]}">' in page.text
    finally:
        root.close()


def test_without_a_session_pages_redirect_to_sign_in_and_live_parts_answer_401(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        for path in PAGES:
            answer = anonymous.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"] == "/login?next=" + path.replace("/", "%2F")
        for path in ("/settings/nodes/live", "/jobs/live", "/tasks/tsk_x/live", "/jobs/job_x/live"):
            answer = anonymous.get(path)
            assert answer.status_code == 401
            assert answer.json() == {"code": "unauthenticated", "error": "sign in first"}
        assert anonymous.get("/").headers["location"] == "/login"
        assert anonymous.get("/login").status_code == 200


@pytest.mark.parametrize(
    ("given", "kept"),
    [("/jobs?state=QUEUED", "/jobs?state=QUEUED"), ("https://evil.example/x", "/tasks"), ("//evil.example/x", "/tasks"),
     ("/\\evil.example", "/tasks"), ("jobs", "/tasks"), ("", "/tasks"), ("/tasks/{csrfToken}", "/tasks")],
)  # fmt: skip
def test_sign_in_returns_only_to_a_path_on_this_hub(hub: HubServer, given: str, kept: str) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        page = anonymous.get("/login", params={"next": given})
    assert page.status_code == 200
    found = re.search(r'data-next="([^"]*)"', page.text)
    assert found is not None and found.group(1) == kept.replace("&", "&amp;")


def test_admin_pages_refuse_a_user_and_a_signed_in_visit_to_login_goes_on(hub: HubServer) -> None:
    alice = login(hub, "alice")
    try:
        for path in ("/settings/nodes", "/settings/accounts", "/settings/accounts/root"):
            page = alice.get(path)
            assert page.status_code == 403 and "admin_required" in page.text, path
        part = alice.get("/settings/nodes/live")
        assert part.status_code == 403 and part.json()["code"] == "admin_required"
        own = alice.get("/settings")  # a user's settings are their own password
        assert own.status_code == 303 and own.headers["location"] == "/settings/password"
        password = alice.get("/settings/password").text
        assert "Change password" in password and 'href="/settings/nodes"' not in password
        back = alice.get("/login", params={"next": "/jobs"})
        assert back.status_code == 303 and back.headers["location"] == "/jobs"
    finally:
        alice.close()


def test_text_is_escaped_and_another_tenant_s_task_is_not_found(hub: HubServer) -> None:
    alice, mallory = login(hub, "alice"), login(hub, "mallory")
    try:
        title = '<script>alert("x")</script>'
        task = alice.post("/api/tasks", json={"title": title, "prompt": "<b>hi</b>", "cell": "local",
                                              "profile": "default"}).json()["task"]  # fmt: skip
        page = alice.get(f"/tasks/{task['id']}")
        assert title not in page.text and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page.text
        assert "&lt;b&gt;hi&lt;/b&gt;" in page.text
        other = mallory.get(f"/tasks/{task['id']}")
        assert other.status_code == 404 and "not_found" in other.text and "alert(" not in other.text
        assert mallory.get(f"/tasks/{task['id']}/live").json()["code"] == "not_found"
    finally:
        alice.close()
        mallory.close()


def test_pages_are_not_in_the_openapi_document(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        paths = anonymous.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if not p.startswith("/api/") and p not in ("/healthz", "/readyz", "/metrics")]


def test_static_files_are_served_and_a_missing_one_is_the_canonical_404(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        assert anonymous.get("/static/app.js").headers["content-type"].startswith("text/javascript")
        assert anonymous.get("/static/app.css").headers["content-type"].startswith("text/css")
        missing = anonymous.get("/static/nope.js")
    assert missing.status_code == 404 and missing.json() == {"code": "not_found", "error": "not found"}


def _rows(html: str) -> int:
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in html else ""
    return body.count("<tr")


def _older(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">Older entries</a>', html)
    return found.group(1).replace("&amp;", "&") if found else None


def test_long_lists_page_back_through_older_entries(hub: HubServer) -> None:
    alice, root = login(hub, "alice"), login(hub, "root")
    try:
        for n in range(53):
            task = alice.post("/api/tasks", json={"title": f"task {n}", "prompt": "p", "cell": "local",
                                                  "profile": "default"}).json()["task"]  # fmt: skip
            assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
            assert root.post(f"/api/tasks/{task['id']}/approve").status_code == 200
        for path, state in (("/tasks", "DISPATCHED"), ("/jobs", "QUEUED"), ("/audit", None)):
            first = root.get(path, params={"state": state} if state else {})
            assert first.status_code == 200 and _rows(first.text) == 50, path
            assert "Back to the newest" not in first.text
            older = _older(first.text)
            assert older is not None and older.startswith(path + "?")
            if state:
                assert f"state={state}" in older  # the filter is kept
            second = root.get(older)
            assert second.status_code == 200 and _rows(second.text) >= 3 and "Back to the newest" in second.text
        assert _older(root.get("/tasks", params={"state": "DISPATCHED"}).text) is not None
        assert _older(alice.get("/tasks", params={"state": "REJECTED"}).text) is None  # nothing more to show
        for path in ("/tasks", "/jobs", "/audit"):
            bad = root.get(path, params={"cursor": "not-a-cursor"})
            assert bad.status_code == 400 and "invalid_request" in bad.text, path
        assert root.get("/jobs/live", params={"cursor": "not-a-cursor"}).json()["code"] == "invalid_request"
    finally:
        alice.close()
        root.close()


def test_the_task_form_offers_the_author_s_usable_profiles_in_one_select(hub: HubServer, tmp_path: Path) -> None:
    add_account(hub, "carol", allowed_profiles={"local": ["default", "research"], "lab": ["default"]})
    register_node(hub, tmp_path / "node", hermes_url="http://127.0.0.1:9119", session_token="t" * 32)  # offline
    carol, nobody = login(hub, "carol"), None
    try:
        form = carol.get("/tasks").text
        options = re.findall(r'<option value="([^"]*)">([^<]*)</option>', form)
        shown = [text for _, text in options]
        assert shown == ["default on lab (no execution node)", "default on local (node offline)",
                         "research on local (the node does not allow it)"]  # fmt: skip
        assert json.loads(html.unescape(options[1][0])) == {"cell": "local", "profile": "default"}
        assert 'name="cell"' not in form and 'list="source-names"' not in form  # no free-text fields any more
        add_account(hub, "dora")  # no profile at all
        nobody = login(hub, "dora")
        empty = nobody.get("/tasks").text
        assert "You may not use any Hermes profile yet" in empty and "<option" not in empty
    finally:
        carol.close()
        if nobody is not None:
            nobody.close()


def test_the_audit_page_shows_each_subject_as_labelled_fields(hub: HubServer) -> None:
    root = login(hub, "root")
    try:
        body = {"title": "t", "prompt": "p", "cell": "local", "profile": "default"}
        task = root.post("/api/tasks", json=body).json()["task"]
        page = root.get("/audit").text
        assert f'Task <a href="/tasks/{task["id"]}"><code>{task["id"]}</code></a>' in page
        assert "{&#39;task&#39;" not in page and "{'task'" not in page  # no Python dict text
    finally:
        root.close()


def test_the_favicon_is_an_empty_answer_not_a_404(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url) as anonymous:
        icon = anonymous.get("/favicon.ico", headers={"Accept": "image/avif,image/webp,*/*"})
        assert icon.status_code == 204 and icon.content == b""
        assert icon.headers["x-content-type-options"] == "nosniff"


def test_the_jobs_list_links_each_job_by_its_task_title_and_shows_the_id_s_distinguishing_tail(hub: HubServer) -> None:
    alice, root = login(hub, "alice"), login(hub, "root")
    try:
        jobs = []
        for title in ("Release notes", "Weekly <report>"):
            task = alice.post("/api/tasks", json={"title": title, "prompt": "p", "cell": "local",
                                                  "profile": "default"}).json()["task"]  # fmt: skip
            assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
            jobs.append(root.post(f"/api/tasks/{task['id']}/approve").json()["job"]["id"])
        assert jobs[0][:8] == jobs[1][:8]  # ids made in the same millisecond range share their time part
        page = alice.get("/jobs").text
        row = r'<a href="/jobs/(job_[0-9A-Z]+)">([^<]*)</a> <code class="id-tail" title="\1">…(\w+)</code>'
        links = re.findall(row, page)
        assert sorted((job, html.unescape(title), tail) for job, title, tail in links) == sorted(
            [(jobs[1], "Weekly <report>", jobs[1][-6:]), (jobs[0], "Release notes", jobs[0][-6:])]
        )
        assert jobs[0][-6:] != jobs[1][-6:]
        assert set(alice.get("/api/jobs").json()["jobs"][0]) >= {"id", "taskId"}  # the JSON API keeps its shape
        assert "taskTitle" not in alice.get("/api/jobs").json()["jobs"][0]
    finally:
        alice.close()
        root.close()
