"""Accounts administration in a real browser (issue: web UI): create, edit and disable an account."""

from __future__ import annotations

from playwright.sync_api import expect

from talaria.testing.hub_server import HubServer
from tests.browser.conftest import Browsers, sign_in
from tests.conftest import PASSWORD

CAROL_PASSWORD = "carol's long passphrase"
NEW_PASSWORD = "alice's brand new passphrase"


def test_an_admin_creates_edits_and_disables_an_account(hub: HubServer, browsers: Browsers) -> None:
    page = browsers.context().page()
    sign_in(page, hub, "root")
    page.get_by_role("link", name="Settings").click()
    page.get_by_role("link", name="Accounts").click()
    page.get_by_label("Username").fill("carol")
    page.get_by_label("Password").fill(CAROL_PASSWORD)
    page.get_by_label("Allowed profiles per source").fill("local: default, research\nlab: default")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Account carol")).to_be_visible()
    account = hub.hub.accounts.get("carol")
    assert account is not None and account.role == "user" and account.enabled
    assert account.allowed_profiles == {"local": ["default", "research"], "lab": ["default"]}

    page.get_by_label("Role").select_option("admin")
    page.get_by_label("Allowed profiles per source").fill("local: default")
    page.get_by_label("May manage team bots").check()
    # the form's own fields already show the new values: wait for the save itself, then the reloaded page
    with page.expect_response(lambda r: r.url.endswith("/api/admin/accounts/carol") and r.request.method == "PATCH"):
        page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_label("Role")).to_have_value("admin")
    expect(page.get_by_label("Allowed profiles per source")).to_have_value("local: default")
    edited = hub.hub.accounts.get("carol")
    assert edited is not None and edited.role == "admin" and edited.can_manage_team
    assert edited.allowed_profiles == {"local": ["default"]}

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Disable account").click()
    expect(page.get_by_role("button", name="Enable account")).to_be_visible()

    watched = browsers.context()
    watched.expect_refusal("/api/auth/login")
    carol = watched.page()
    carol.goto(f"{hub.url}/login")
    carol.get_by_label("Username").fill("carol")
    carol.get_by_label("Password").fill(CAROL_PASSWORD)
    carol.get_by_role("button", name="Sign in").click()
    expect(carol.get_by_role("alert")).to_contain_text("wrong username or password")


def test_a_malformed_profile_line_is_explained_before_anything_is_sent(hub: HubServer, browsers: Browsers) -> None:
    page = browsers.context().page()
    sign_in(page, hub, "root")
    page.goto(f"{hub.url}/settings/accounts")
    page.get_by_label("Username").fill("dave")
    page.get_by_label("Password").fill(CAROL_PASSWORD)
    page.get_by_label("Allowed profiles per source").fill("default research")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("alert")).to_contain_text("write a source, a colon, then its profiles")
    assert hub.hub.accounts.get("dave") is None


def test_pages_follow_the_dark_colour_scheme(hub: HubServer, browsers: Browsers) -> None:
    light = browsers.context().page()
    sign_in(light, hub, "root")
    dark = browsers.context(color_scheme="dark").page()
    sign_in(dark, hub, "root")
    background = "getComputedStyle(document.body).backgroundColor"
    assert light.evaluate(background) == "rgb(246, 247, 249)"
    assert dark.evaluate(background) == "rgb(17, 20, 24)"


def test_a_person_changes_their_own_password_and_signs_in_with_the_new_one(hub: HubServer, browsers: Browsers) -> None:
    other = browsers.context().page()
    sign_in(other, hub, "alice")  # a second session, which the change ends
    watched = browsers.context()
    watched.expect_refusal("/api/auth/password")  # the wrong current password, on purpose
    page = watched.page()
    sign_in(page, hub, "alice")
    page.get_by_role("link", name="Settings").click()
    page.get_by_role("link", name="Your password").click()
    page.get_by_label("Current password").fill("not the password at all")
    page.get_by_label("New password").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("alert")).to_contain_text("invalid_credentials")
    page.get_by_label("Current password").fill(PASSWORD)
    page.get_by_role("button", name="Change password").click()
    # checking the current password and hashing the new one (argon2id) took over 5 s beside a busy second worker
    expect(page.get_by_role("status")).to_contain_text("Your password was changed", timeout=20_000)
    page.get_by_role("link", name="Tasks").click()
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()  # this session goes on
    other.goto(f"{hub.url}/tasks")
    expect(other).to_have_url(f"{hub.url}/login?next=%2Ftasks")  # the other one ended
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{hub.url}/login")
    sign_in(page, hub, "alice", NEW_PASSWORD)
