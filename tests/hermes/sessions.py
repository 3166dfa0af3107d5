"""A Hermes session driven step by step through the hub's channels (for tests that need more than one
turn in a session, concurrent sessions, or an interrupt)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from talaria.hub.runners.connection_state import Gateway, Grant
from talaria.hub.turns import team_tools
from tests.hermes.conftest import Node


@dataclass
class Session:
    """One Hermes session driven step by step through the hub's channels."""

    node: Node
    gateway: Gateway
    runtime_id: str
    stored_id: str
    grant: Grant | None = None
    active: list[bool] = field(default_factory=lambda: [True])
    account: str = "alice"

    @classmethod
    def open(cls, node: Node, account: str = "alice") -> Session:
        async def go() -> Session:
            gateway = await node.server.hub.channels.open_gateway(node.runner_id, node.account(account))
            created = await node.server.hub.channels.rpc(gateway, "session.create", {"close_on_disconnect": False})
            return cls(node, gateway, created["session_id"], created["stored_session_id"], account=account)

        opened: Session = node.call(go())
        return opened

    @classmethod
    def resume(cls, node: Node, stored_id: str, account: str = "alice", **params: Any) -> Session:
        """``session.resume`` of ``stored_id`` (``params`` added, e.g. ``lazy=True``) on a new gateway of
        ``account``; the session's stored id is taken as ``stored_id``."""

        async def go() -> Session:
            gateway = await node.server.hub.channels.open_gateway(node.runner_id, node.account(account))
            resumed = await node.server.hub.channels.rpc(gateway, "session.resume", {"session_id": stored_id} | params)
            return cls(node, gateway, resumed["session_id"], stored_id, account=account)

        opened: Session = node.call(go())
        return opened

    @classmethod
    def warmed_and_bound(cls, node: Node, work_id: str) -> Session:
        """A session that ran one turn (so Hermes stored it) and is then bound to a grant for ``work_id``."""
        session = cls.open(node)
        session.start("warm up")
        session.wait_idle()
        session.bind(work_id=work_id)
        return session

    def bind(self, work_id: str = "work-1") -> None:
        async def go() -> None:
            channels = self.node.server.hub.channels
            account = self.node.account(self.account)
            identity = team_tools.GrantIdentity(self.account, account.tenant, "local", "default", work_id)

            async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
                return await team_tools.call(identity, tool_id, arguments)

            payload = {"runtimeId": self.runtime_id, "storedId": self.stored_id}
            self.grant = await channels.create_grant(
                self.node.runner_id, account, profile="default", work_id=work_id, session=payload,
                catalog=team_tools.catalog(), executor=execute, turn_active=lambda: self.active[0],
            )  # fmt: skip
            await channels.bind_grant(self.grant, payload)

        self.node.call(go())

    def unbind(self) -> None:
        assert self.grant is not None
        self.node.call(self.node.server.hub.channels.close_grant(self.grant))
        self.grant = None

    def start(self, text: str) -> None:
        self.node.call(
            self.node.server.hub.channels.rpc(
                self.gateway, "prompt.submit", {"session_id": self.runtime_id, "text": text}
            )
        )

    def wait_idle(self, timeout: float = 60.0) -> dict[str, Any]:
        """Until ``message.complete`` and the ``session.info`` with ``running: false`` that follows it; the
        ``message.complete`` payload."""
        events = self.collect_until_idle(timeout)
        complete: dict[str, Any] = next(e["payload"] for e in events if e["type"] == "message.complete")
        return complete

    def close(self) -> None:
        self.node.call(self.node.server.hub.channels.close_gateway(self.gateway))

    def collect_until_idle(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every event of this session up to ``message.complete`` and the idle ``session.info`` after it."""

        async def go() -> list[dict[str, Any]]:
            seen: list[dict[str, Any]] = []
            complete = False
            while True:
                frame = await asyncio.wait_for(self.gateway.events.get(), timeout)
                assert frame is not None, "the gateway closed"
                if frame.get("session_id") != self.runtime_id:
                    continue
                seen.append(frame)
                complete = complete or frame["type"] == "message.complete"
                if complete and frame["type"] == "session.info" and frame["payload"].get("running") is False:
                    return seen

        result: list[dict[str, Any]] = self.node.call(go(), timeout=timeout + 5)
        return result

    def interrupt(self) -> Any:
        return self.node.call(
            self.node.server.hub.channels.rpc(self.gateway, "session.interrupt", {"session_id": self.runtime_id})
        )

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        return self.node.call(self.node.server.hub.channels.rpc(self.gateway, method, params))
