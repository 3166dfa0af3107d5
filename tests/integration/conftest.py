"""Fixtures the integration tests share: cheap argon2 parameters for speed, and ``web`` (a hub with an admin and
two users signed in, web_support.Web)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from talaria.testing.hub_server import HubServer
from tests.integration.web_support import Web, cheapen_argon2, open_web


@pytest.fixture
def fast_argon2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Argon2 with its cheapest parameters (hashes still verify; only the cost changes)."""
    cheapen_argon2(monkeypatch)


@pytest.fixture
def web(make_hub: Callable[..., HubServer], fast_argon2: None) -> Iterator[Web]:
    with ExitStack() as stack:
        yield open_web(make_hub, stack)
