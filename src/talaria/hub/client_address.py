"""The client address of a request (web-api.md 9): the TCP peer, unless that peer is one of the trusted proxies
of ``hub.trusted_proxies``; then the right-most address of ``X-Forwarded-For`` that is not itself trusted.

The sign-in limit and the request logs use it. Peer rules (the Runtime API, lifecycle.md 6.1; ``/metrics``) use
the TCP peer and never this. ``Forwarded`` plays no part; uvicorn's own proxy-header handling is off.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import Scope

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack listener shows IPv4 peers as ::ffff:a.b.c.d
    return address


def tcp_peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class ClientAddresses:
    """Derives client addresses for one hub; built once from the validated setting."""

    def __init__(self, trusted: Iterable[str] = ()) -> None:
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(entry.strip()) for entry in trusted)

    def trusts(self, address: Address | None) -> bool:
        return address is not None and any(address in network for network in self.networks)

    def of(self, scope: Scope) -> str:
        """The client address of this request (a string; empty when the server gave no peer).

        Walks ``X-Forwarded-For`` (every such header, in order) from the right while the hop is trusted; the
        first untrusted address is the client. An entry that is not an IP address ends the walk at the trusted
        hop to its right, since nothing left of it can be believed; when every hop is trusted, the left-most is
        the client."""
        peer = tcp_peer(scope)
        if not self.networks or not self.trusts(_address(peer)):
            return peer
        hops = [
            hop
            for name, value in scope.get("headers", [])
            if name == b"x-forwarded-for"
            for hop in value.decode("latin-1").split(",")
            if hop.strip()
        ]
        client = peer
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return client
            client = str(address)
            if not self.trusts(address):
                return client
        return client
