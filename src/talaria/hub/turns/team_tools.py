"""Team tools the hub offers to a Hermes turn through a tool grant (runner-protocol.md 12).

A tool runs on the hub with the identity the hub bound to the grant (account, tenant, source,
profile, work), never with identities taken from the model's arguments. This release has one
built-in diagnostic tool, ``talaria_whoami``, which answers that identity so tests and the demo can
prove it is server-side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from talaria.errors import TalariaError

WHOAMI = "talaria_whoami"


@dataclass(frozen=True)
class GrantIdentity:
    """Who a grant acts for, fixed by the hub when it creates the grant."""

    account: str
    tenant: str
    source: str
    profile: str
    work_id: str
    grant_id: str = ""


def catalog() -> list[dict[str, Any]]:
    """The tools a grant offers, as the runner's listener publishes them (ids are made opaque there)."""
    return [
        {
            "id": WHOAMI,
            "name": WHOAMI,
            "description": "Tells who this conversation acts for in Talaria: account, tenant, source, profile, "
            "work and grant. Takes no arguments.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": True},
        }
    ]


WHOAMI_KIND = "whoami"


def descriptor(identity: GrantIdentity) -> dict[str, Any]:
    """A grant's ``tools`` for this catalog: its identity, from which any replica answers (scale.md 4.3)."""
    return {"kind": WHOAMI_KIND, "account": identity.account, "tenant": identity.tenant, "source": identity.source,
            "profile": identity.profile, "workId": identity.work_id}  # fmt: skip


def from_descriptor(grant_id: str, tools: dict[str, Any]) -> Callable[[str, dict[str, Any]], Awaitable[Any]]:
    """The executor of a grant made from its ``tools`` on a replica other than its owner."""
    identity = GrantIdentity(tools["account"], tools["tenant"], tools["source"], tools["profile"], tools["workId"],
                             grant_id)  # fmt: skip

    async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
        return await call(identity, tool_id, arguments)

    return execute


async def call(identity: GrantIdentity, tool_id: str, arguments: dict[str, Any]) -> Any:
    """Run one team tool for ``identity``; ``arguments`` never change who the tool acts for."""
    if tool_id == WHOAMI:
        return {
            "account": identity.account,
            "tenant": identity.tenant,
            "source": identity.source,
            "profile": identity.profile,
            "workId": identity.work_id,
            "grantId": identity.grant_id,
        }
    raise TalariaError("not_found", f"no team tool {tool_id[:100]!r}")
