"""Settings → Hermes connection → Execution nodes in a real browser (issue: web UI): register a node with the
keyboard only, download its runner.json once, start a real runner with it and watch the node turn Connected,
then disable it and watch it turn Disabled while the runner stops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, expect

from talaria.canonical import sha256_hex
from talaria.hub.runners.connection_state import AccountRef
from talaria.release import runner_version
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.browser.conftest import DESKTOP, PHONE, Browsers, assert_fits, screenshot_dir, sign_in
from tests.conftest import login
from tests.integration.runner_support import RunnerProcess, register_node

HERMES_URL = "http://127.0.0.1:9119"  # never reached: a runner asks Hermes for nothing before a command


def node_row(page: Page, name: str) -> Locator:
    """The node list's row of ``name`` (found again after every live refresh)."""
    return page.locator("tr", has=page.get_by_text(name, exact=True))


def test_register_download_connect_and_disable_a_node(hub: HubServer, browsers: Browsers, tmp_path: Path) -> None:
    page = browsers.context().page()
    sign_in(page, hub, "root")
    page.get_by_role("link", name="Settings").click()
    page.get_by_role("link", name="Execution nodes").click()
    expect(page).to_have_url(f"{hub.url}/settings/nodes")
    expect(page.get_by_text("No execution nodes yet")).to_be_visible()
    expect(page.get_by_text("Leave it empty to forbid every export")).to_be_visible()
    expect(page.get_by_text("cross the network unencrypted")).to_be_visible()

    # keyboard only, in the order of the labels
    page.get_by_label("Name").focus()
    page.keyboard.type("build-box")
    for label, text in (("Source", None), ("Allowed profiles", None), ("Hub URL", None), ("Hermes URL", HERMES_URL),
                        ("Artifact roots", str(tmp_path / "exports"))):  # fmt: skip
        page.keyboard.press("Tab")
        expect(page.get_by_label(label, exact=True)).to_be_focused()
        if text is not None:
            page.keyboard.press("ControlOrMeta+a")
            page.keyboard.type(text)
    page.keyboard.press("Tab")
    expect(page.get_by_label("Allow plain HTTP on a trusted LAN")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Register")).to_be_focused()
    page.keyboard.press("Enter")

    download_button = page.get_by_role("button", name="Download runner.json")
    expect(download_button).to_be_visible()
    expect(page.get_by_text("shown only this once")).to_be_visible()
    expect(page.get_by_text("chmod 600 ~/.talaria/runner.json")).to_be_visible()
    with page.expect_download() as downloading:
        download_button.click()
    download = downloading.value
    assert download.suggested_filename == "runner.json"
    config_path = tmp_path / "node" / "runner.json"
    config_path.parent.mkdir()
    download.save_as(config_path)
    config = json.loads(config_path.read_text())
    assert config["protocol"] == 1 and len(config["token"]) == 43
    assert config["serverURL"] == hub.url and config["hermesURL"] == HERMES_URL
    assert config["allowedProfiles"] == ["default"] and config["artifactRoots"] == [str(tmp_path / "exports")]
    assert "allowInsecureLan" not in config
    token, token_hash = config["token"], sha256_hex(config["token"])

    # neither the list page nor its JSON API ever carries the token or its hash
    root = login(hub, "root")
    try:
        listing = root.get("/api/admin/runners").text
        part = root.get("/settings/nodes/live").text
        page_again = root.get("/settings/nodes").text
    finally:
        root.close()
    for text in (listing, part, page_again):
        assert "build-box" in text
        assert token not in text and token_hash not in text

    row = node_row(page, "build-box")
    expect(row.get_by_test_id("node-status")).to_have_text("Waiting for connection")
    config_path.chmod(0o600)
    runner = RunnerProcess(config_path, tmp_path / "logs")
    try:
        runner.wait_for("runner connected")
        expect(row.get_by_test_id("node-status")).to_have_text("Connected", timeout=10_000)  # no reload
        expect(row).to_contain_text("team-tools-v1")
        expect(row.get_by_test_id("node-version")).to_have_text(runner_version())
        for name, size in (("desktop", DESKTOP), ("phone", PHONE)):
            page.set_viewport_size(size)
            assert_fits(page)
            page.screenshot(path=screenshot_dir() / f"nodes-{name}.png", full_page=True)
        page.set_viewport_size(DESKTOP)

        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Disable build-box").click()
        expect(row.get_by_test_id("node-status")).to_have_text("Disabled")
        expect(row).to_contain_text("register it again")
        expect(page.get_by_role("button", name="Disable build-box")).to_have_count(0)
        assert runner.wait(15) == 3  # a terminal refusal: not restarted by a service manager
        assert "disabled" in runner.stderr
    finally:
        runner.close()


def test_a_dismissed_confirmation_disables_nothing(hub: HubServer, browsers: Browsers) -> None:
    root = login(hub, "root")
    try:
        made = root.post("/api/admin/runners", json={"name": "kept", "allowedProfiles": ["default"]})
        assert made.status_code == 201, made.text
    finally:
        root.close()
    page = browsers.context().page()
    sign_in(page, hub, "root")
    page.goto(f"{hub.url}/settings/nodes")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Disable kept").click()
    page.wait_for_timeout(500)
    page.reload()
    row = node_row(page, "kept")
    expect(row.get_by_test_id("node-status")).to_have_text("Waiting for connection")


def test_a_refused_registration_shows_the_hub_s_reason_and_keeps_the_form(hub: HubServer, browsers: Browsers) -> None:
    watched = browsers.context()
    watched.expect_refusal("/api/admin/runners")
    page = watched.page()
    sign_in(page, hub, "root")
    page.goto(f"{hub.url}/settings/nodes")
    page.get_by_label("Name").fill("remote")
    page.get_by_label("Hermes URL").fill("http://192.168.1.20:9119")
    page.get_by_role("button", name="Register").click()
    expect(page.get_by_role("alert")).to_contain_text("hermesURL")
    expect(page.get_by_role("alert")).to_contain_text("invalid_runner_config")
    expect(page.get_by_label("Name")).to_have_value("remote")  # nothing typed is lost
    expect(page.get_by_role("button", name="Download runner.json")).to_be_hidden()


def test_drain_shows_draining_until_the_runner_has_finished_and_stopped(
    hub: HubServer, browsers: Browsers, tmp_path: Path
) -> None:
    with HermesFixture() as hermes:
        config = register_node(hub, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token,
                               name="edge")  # fmt: skip
        runner_id = json.loads(config.read_text())["runnerId"]
        runner = RunnerProcess(config, tmp_path / "logs")
        try:
            runner.wait_for("runner connected")
            root = hub.hub.accounts.get("root")
            assert root is not None
            account = AccountRef(root.username, root.tenant, root.auth_version)
            gateway = hub.call(hub.hub.channels.open_gateway(runner_id, account))  # work in flight keeps it draining
            page = browsers.context().page()
            sign_in(page, hub, "root")
            page.goto(f"{hub.url}/settings/nodes")
            row = node_row(page, "edge")
            expect(row.get_by_test_id("node-status")).to_have_text("Connected")
            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Drain edge").click()
            expect(row.get_by_test_id("node-status")).to_have_text("Draining")
            expect(page.get_by_role("button", name="Drain edge")).to_have_count(0)
            runner.wait_for("runner draining")
            assert runner.proc.poll() is None, "the open channel keeps it running"
            hub.call(hub.hub.channels.close_gateway(gateway))
            assert runner.wait(15) == 0, runner.stderr
            assert "runner drained" in runner.lines
            expect(row.get_by_test_id("node-status")).to_have_text("Waiting for connection", timeout=10_000)
        finally:
            runner.close()


def test_rotate_token_warns_that_it_locks_no_one_out_and_the_runner_takes_a_new_token(
    hub: HubServer, browsers: Browsers, tmp_path: Path
) -> None:
    config = register_node(hub, tmp_path / "node", hermes_url=HERMES_URL, session_token="unused", name="edge")
    body = json.loads(config.read_text())
    runner = RunnerProcess(config, tmp_path / "logs")
    try:
        runner.wait_for("runner connected")
        page = browsers.context().page()
        sign_in(page, hub, "root")
        page.goto(f"{hub.url}/settings/nodes")
        row = node_row(page, "edge")
        expect(row.get_by_test_id("node-token")).to_contain_text("Token issued")
        expect(row.get_by_test_id("node-token")).not_to_contain_text("Rotation pending")
        messages: list[str] = []

        def answer(dialog: Any) -> None:
            messages.append(dialog.message)
            dialog.dismiss() if len(messages) == 1 else dialog.accept()

        page.on("dialog", answer)
        row.get_by_role("button", name="Rotate token").click()  # dismissed: nothing asked
        expect(row.get_by_role("button", name="Rotate token")).to_be_enabled()
        record = hub.hub.registry.get(body["runnerId"])
        assert record is not None and record.rotate_requested_at is None
        row.get_by_role("button", name="Rotate token").click()
        runner.wait_for("runner credential rotated", timeout=10)
        assert messages[0] == messages[1]
        assert messages[0].endswith(
            "Rotation does not lock out someone who already holds this node's token. To do that, disable the node and "
            "register it again."
        ), messages[0]
        record = hub.hub.registry.get(body["runnerId"])
        assert record is not None and record.token_hash != sha256_hex(body["token"])
        expect(row.get_by_test_id("node-token")).not_to_contain_text("Rotation pending")
        assert body["token"] not in page.content()
    finally:
        runner.close()
