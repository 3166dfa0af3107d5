"""Team tools on real Hermes (hermes.md 8): a grant bound to one session is visible and callable there only,
gone after unbind, and opaque per grant."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from talaria.hub.runners.state import Gateway, Grant
from talaria.hub.turns import team_tools
from talaria.testing.model_server import LoggedRequest, ToolSelector, reply, slow, tool_call, when
from tests.hermes.conftest import Node

TEAM = "team_"


@dataclass
class Session:
    """One Hermes session driven step by step through the hub's channels."""

    node: Node
    gateway: Gateway
    runtime_id: str
    stored_id: str
    grant: Grant | None = None
    active: list[bool] = field(default_factory=lambda: [True])

    @classmethod
    def open(cls, node: Node) -> Session:
        async def go() -> Session:
            gateway = await node.server.hub.channels.open_gateway(node.runner_id, node.account())
            created = await node.server.hub.channels.rpc(gateway, "session.create", {"close_on_disconnect": False})
            return cls(node, gateway, created["session_id"], created["stored_session_id"])

        opened: Session = node.call(go())
        return opened

    def bind(self, work_id: str = "work-1") -> None:
        async def go() -> None:
            channels = self.node.server.hub.channels
            identity = team_tools.GrantIdentity("alice", self.node.account().tenant, "local", "default", work_id)

            async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
                return await team_tools.call(identity, tool_id, arguments)

            payload = {"runtimeId": self.runtime_id, "storedId": self.stored_id}
            self.grant = await channels.create_grant(
                self.node.runner_id, self.node.account(), profile="default", work_id=work_id, session=payload,
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
        """Until ``message.complete`` and the ``session.info`` with ``running: false`` that follows it."""

        async def go() -> dict[str, Any]:
            complete: dict[str, Any] | None = None
            while True:
                frame = await asyncio.wait_for(self.gateway.events.get(), timeout)
                assert frame is not None, "the gateway closed"
                if frame.get("session_id") != self.runtime_id:
                    continue
                if frame["type"] == "message.complete":
                    complete = frame["payload"]
                if (
                    complete is not None
                    and frame["type"] == "session.info"
                    and frame["payload"].get("running") is False
                ):
                    return complete

        result: dict[str, Any] = self.node.call(go(), timeout=timeout + 5)
        return result

    def close(self) -> None:
        self.node.call(self.node.server.hub.channels.close_gateway(self.gateway))


def offered_team_tools(request: LoggedRequest) -> list[str]:
    return [name for name in request.tools if name.startswith(TEAM)]


def requests_with(node: Node, text: str) -> list[LoggedRequest]:
    return [r for r in node.model.chat_requests() if r.tools and any(text in json.dumps(m) for m in r.body["messages"])]


def tool_results(request: LoggedRequest) -> list[str]:
    return [str(m.get("content")) for m in request.body["messages"] if m.get("role") == "tool"]


def test_a_bound_tool_is_seen_and_callable_only_in_its_session_and_gone_after_unbind(node: Node) -> None:
    a, b = Session.open(node), Session.open(node)
    a.bind()
    node.model.script(
        when("alpha-1", tool_call(ToolSelector(TEAM, "talaria_whoami"), {"account": "mallory"}),
             slow("alpha done", first_byte_delay_s=2.0)),
    )  # fmt: skip
    a.start("alpha-1")
    node.model.wait_for(lambda log: any(offered_team_tools(r) for r in log if r.last_user == "alpha-1"), timeout=60)
    name = offered_team_tools(next(r for r in node.model.chat_requests() if r.last_user == "alpha-1"))[0]
    # B, open at the same time, is never offered A's tool, and calling it by name is refused inside Hermes
    node.model.script(when("beta-1", tool_call(name, {}), reply("beta done")))
    b.start("beta-1")
    assert b.wait_idle()["text"] == "beta done"
    beta = requests_with(node, "beta-1")
    assert beta and all(offered_team_tools(r) == [] for r in beta)
    refusal = tool_results(beta[-1])[-1]
    assert "alice" not in refusal and ("does not exist" in refusal or "not available" in refusal), refusal
    # A's call reached the hub and answered the identity the hub bound, not the model's arguments
    assert a.wait_idle()["text"] == "alpha done"
    identity = json.loads(tool_results(requests_with(node, "alpha-1")[-1])[-1])
    assert identity["account"] == "alice" and identity["workId"] == "work-1"
    # after unbind, A's next turn is offered no team tool
    a.unbind()
    node.model.script(when("alpha-2", reply("no tools now")))
    a.start("alpha-2")
    assert a.wait_idle()["text"] == "no tools now"
    assert all(offered_team_tools(r) == [] for r in node.model.chat_requests() if r.last_user == "alpha-2")
    a.close()
    b.close()


def test_two_concurrent_grants_get_different_opaque_names(node: Node) -> None:
    first, second = Session.open(node), Session.open(node)
    first.bind(work_id="w-1")
    second.bind(work_id="w-2")
    node.model.script(when("gamma", reply("ok")))
    first.start("gamma first")
    second.start("gamma second")
    first.wait_idle()
    second.wait_idle()
    names_first = {n for r in node.model.chat_requests() if r.last_user == "gamma first" for n in offered_team_tools(r)}
    names_second = {
        n for r in node.model.chat_requests() if r.last_user == "gamma second" for n in offered_team_tools(r)
    }
    assert len(names_first) == 1 and len(names_second) == 1
    assert names_first != names_second
    first.unbind()
    second.unbind()
    first.close()
    second.close()
