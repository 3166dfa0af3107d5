"""A web session is made for the account as its password was checked (web-api.md 3, scale.md 3.7), on both
backends: a password, role or enablement change committed after the sign-in read the account (which ended the
account's sessions) refuses the new session with 401 ``invalid_credentials`` instead of leaving one the change did
not end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.accounts.service import Accounts
from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.api.websession import WebSessions
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Store
from tests.backends import BackendDatabase, raw_sql
from tests.conftest import PASSWORD

pytestmark = pytest.mark.usefixtures("fast_argon2")


@pytest.fixture
def settings(backend_database: BackendDatabase, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, **backend_database.settings())


@pytest.fixture
def store(backend_database: BackendDatabase, tmp_path: Path) -> Iterator[Store]:
    opened = backend_database.open_store(tmp_path)
    try:
        migrations.upgrade(opened)
        with opened.write() as tx:
            tx.run("tenant_ensure", name="default", now=1)
        yield opened
    finally:
        opened.close()  # type: ignore[attr-defined]


def sessions_of(settings: Settings, username: str) -> int:
    return len(raw_sql(settings, "SELECT id_hash FROM web_session WHERE username = ?", username))


@pytest.mark.parametrize("change", [{"password": PASSWORD + "-new"}, {"role": "admin"}, {"enabled": False}])
def test_a_session_is_refused_once_the_account_changed_after_its_password_was_checked(
    store: Store, settings: Settings, change: dict[str, object]
) -> None:
    clock = ManualClock(1_700_000_000_000)
    accounts, sessions = Accounts(store, clock), WebSessions(store, clock, b"k" * 32, public_origin="http://x")
    accounts.create(username="uma", password=PASSWORD, role="user")
    found = accounts.credentials("uma")
    assert found is not None
    checked, _hash = found
    cookie, _csrf = sessions.create(checked)  # still current: made
    assert sessions.lookup(cookie) is not None
    accounts.update("uma", "default", change)  # ends her sessions, authVersion + 1
    with pytest.raises(TalariaError) as refused:
        sessions.create(checked)
    assert (refused.value.code, refused.value.status) == ("invalid_credentials", 401)
    assert sessions.lookup(cookie) is None and sessions_of(settings, "uma") == 0
    current = accounts.get("uma")
    assert current is not None
    if current.enabled:
        sessions.create(current)
        assert sessions_of(settings, "uma") == 1
