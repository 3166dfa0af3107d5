"""The client address behind trusted proxies (web-api.md 9): the rules of ``ClientAddresses.of``."""

from __future__ import annotations

import pytest

from talaria.hub.client_address import ClientAddresses


def _scope(peer: str, *forwarded: str) -> dict[str, object]:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return {"type": "http", "client": (peer, 40000), "headers": headers}


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("127.0.0.1", ("198.51.100.1",), "198.51.100.1"),
        ("127.0.0.1", ("203.0.113.9, 198.51.100.1, 10.1.2.3",), "198.51.100.1"),
        ("127.0.0.1", ("203.0.113.9", "198.51.100.1, 10.1.2.3"), "198.51.100.1"),  # two headers, in order
        ("127.0.0.1", (), "127.0.0.1"),
        ("127.0.0.1", ("10.1.2.3, 10.4.5.6",), "10.1.2.3"),  # every hop trusted: the left-most
        ("127.0.0.1", ("198.51.100.1, not-an-address, 10.1.2.3",), "10.1.2.3"),  # garbage ends the walk
        ("127.0.0.1", ("unknown",), "127.0.0.1"),
        ("::ffff:127.0.0.1", ("198.51.100.1",), "198.51.100.1"),  # dual-stack listener
        ("192.0.2.7", ("198.51.100.1",), "192.0.2.7"),  # an untrusted peer's header is ignored
    ],
)
def test_the_right_most_untrusted_address_behind_trusted_peers(
    peer: str, forwarded: tuple[str, ...], client: str
) -> None:
    assert ClientAddresses(["127.0.0.1", "10.0.0.0/8"]).of(_scope(peer, *forwarded)) == client


def test_without_trusted_proxies_the_client_is_the_tcp_peer() -> None:
    assert ClientAddresses().of(_scope("127.0.0.1", "198.51.100.1")) == "127.0.0.1"
