"""Tasks, approvals, jobs and audit in a real browser (issue: web UI), with a real runner in front of a real
Hermes driven by the scripted model: one account writes and submits, another approves, and both watch the
job finish without reloading."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer, reply, slow, when
from talaria.testing.real_hermes import RealHermes
from tests.browser.conftest import DESKTOP, PHONE, Browsers, assert_fits, screenshot_dir, sign_in
from tests.conftest import login
from tests.integration.runner_support import RunnerProcess, register_node


@pytest.fixture
def node(hub: HubServer, model: ModelServer, tmp_path: Path, hermes_executable: Path) -> Iterator[RunnerProcess]:
    """A real Hermes and a connected runner for source ``local``."""
    with RealHermes(tmp_path / "hermes", model.base_url) as hermes:
        config = register_node(hub, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
        runner = RunnerProcess(config, tmp_path / "logs")
        try:
            runner.wait_for("runner connected")
            yield runner
        finally:
            runner.close()


def test_a_task_is_written_approved_by_another_account_and_followed_to_its_finished_job(
    hub: HubServer, browsers: Browsers, model: ModelServer, node: RunnerProcess
) -> None:
    model.script(when("release notes", reply("The release adds durable jobs and a web UI.")))
    author = browsers.context().page()
    sign_in(author, hub, "alice")
    author.get_by_label("Title").fill("Release notes")
    author.get_by_label("Prompt").fill("Summarise the release notes in one sentence.")
    expect(author.get_by_label("Profile").locator("option")).to_have_text(["default on local"])
    author.get_by_label("Profile").select_option(label="default on local")
    author.get_by_role("button", name="Create").click()
    expect(author.get_by_role("heading", name="Release notes")).to_be_visible()
    expect(author.get_by_test_id("task-state")).to_have_text("Draft")
    author.get_by_role("button", name="Submit for approval").click()
    expect(author.get_by_test_id("task-state")).to_have_text("Pending approval")
    expect(author.get_by_role("button", name="Approve")).to_have_count(0)  # alice is no admin

    approver = browsers.context().page()
    sign_in(approver, hub, "bob")
    approver.get_by_role("link", name="Release notes").click()
    expect(approver.get_by_test_id("task-state")).to_have_text("Pending approval")
    approver.get_by_role("button", name="Approve").click()

    # the author's page follows the task and its job to the end without a reload
    expect(author.get_by_test_id("job-state")).to_have_text("Succeeded", timeout=60_000)
    expect(author.get_by_test_id("task-state")).to_have_text("Succeeded")
    expect(author.get_by_text("The release adds durable jobs and a web UI.")).to_be_visible()

    approver.get_by_role("link", name="Jobs").click()
    approver.locator("table a").first.click()
    expect(approver.get_by_test_id("job-state")).to_have_text("Succeeded")
    facts = approver.locator("dl.facts")
    expect(facts).to_contain_text("1 of 3")  # attempt
    for label in ("Lease owner", "Lease epoch", "Last heartbeat", "Cancel requested", "Result digest"):
        expect(facts.get_by_text(label, exact=True)).to_be_visible()
    expect(approver.get_by_test_id("job-reply")).to_have_text("The release adds durable jobs and a web UI.")
    events = approver.locator("table.events tbody tr")
    expect(events.filter(has_text="job.completed")).to_have_count(1)
    digests = approver.locator("table.events td[data-label=Evidence] code.digest")
    expect(digests).not_to_have_count(0)  # evidence digests are shown in full
    for digest in digests.all_inner_texts():
        assert re.fullmatch(r"[0-9a-f]{64}", digest), digest
    for name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        approver.set_viewport_size(size)
        assert_fits(approver)
        approver.screenshot(path=screenshot_dir() / f"job-{name}.png", full_page=True)
    approver.set_viewport_size(DESKTOP)

    approver.get_by_role("link", name="Audit").click()
    expect(approver.get_by_test_id("chain-status")).to_contain_text("The chain verifies")


def test_an_admin_cancels_a_running_job_from_its_page(
    hub: HubServer, browsers: Browsers, model: ModelServer, node: RunnerProcess
) -> None:
    model.script(when("endless", slow("word " * 400, chunk_delay_s=0.5)))
    alice, root = login(hub, "alice"), login(hub, "root")
    try:
        task = alice.post("/api/tasks", json={"title": "Endless", "prompt": "an endless essay", "cell": "local",
                                              "profile": "default"}).json()["task"]  # fmt: skip
        assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
        job = root.post(f"/api/tasks/{task['id']}/approve").json()["job"]
    finally:
        alice.close()
        root.close()
    page = browsers.context().page()
    sign_in(page, hub, "bob")
    page.goto(f"{hub.url}/jobs/{job['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("Running", timeout=60_000)
    model.wait_for(lambda log: any("endless" in (r.last_user or "") for r in log), timeout=60)
    page.once("dialog", lambda dialog: dialog.accept())
    asked = time.monotonic()
    page.get_by_role("button", name="Cancel job").click()
    expect(page.get_by_test_id("job-state")).to_have_text("Cancelled", timeout=5_000)
    assert time.monotonic() - asked < 5
    expect(page.locator("dl.facts")).to_contain_text("Yes")  # cancel requested
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)


def test_a_rejected_task_shows_who_rejected_it_and_why(hub: HubServer, browsers: Browsers) -> None:
    alice = login(hub, "alice")
    try:
        task = alice.post("/api/tasks", json={"title": "Risky", "prompt": "delete everything", "cell": "local",
                                              "profile": "default"}).json()["task"]  # fmt: skip
        assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
    finally:
        alice.close()
    page = browsers.context().page()
    sign_in(page, hub, "bob")
    page.goto(f"{hub.url}/tasks/{task['id']}")
    page.get_by_label("Reason for rejecting").fill("too broad")
    page.get_by_role("button", name="Reject").click()
    expect(page.get_by_test_id("task-state")).to_have_text("Rejected")
    expect(page.locator("dl.facts")).to_contain_text("bob")
    expect(page.locator("dl.facts")).to_contain_text("too broad")


def test_an_admin_checks_the_node_s_hermes_from_the_node_list(
    hub: HubServer, browsers: Browsers, node: RunnerProcess
) -> None:
    page = browsers.context().page()
    sign_in(page, hub, "bob")
    page.goto(f"{hub.url}/settings/nodes")
    page.get_by_role("button", name="Check Hermes on node").click()
    result = page.get_by_role("status")
    expect(result).to_contain_text("node: Hermes 0.19.0", timeout=30_000)
    expect(result).to_contain_text("team tools ready in profile default")
