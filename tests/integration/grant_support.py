"""Grants a hub opens on a raw runner instance (runner-protocol.md 9; scale.md 4.3): the ``grant.create`` command
taken, admitted and answered through a machine client of either replica; the ``probe`` tool kind, whose calls record
where they ran; and a team round's grant (team-tools.md 5), whose calls run in the hub's own team tool frame on
whichever replica they reach."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from talaria.errors import TalariaError
from talaria.hub.runners.channels import ToolKind
from talaria.hub.runners.connection_state import AccountRef, Grant, ToolExecutor
from talaria.hub.turns.team_round import ROUND_KIND
from talaria.teams.round import Round
from talaria.testing.hub_server import HubServer
from tests.integration.runner_support import Machine, assert_machine_ok, outcome, spawn


class ProbeTools:
    """A grant's executors on replicas ``a`` and ``b`` (the kind ``probe``; one hub may be both): each call records
    where it ran; a call with ``{"hold": true}`` waits until ``release`` is set; ``{"refuse": true}`` answers
    ``team_tools_forbidden``."""

    def __init__(self, a: HubServer, b: HubServer) -> None:
        self.ran: list[tuple[str, str]] = []  # (replica, tool id)
        self.release = threading.Event()
        for name, server in (("b", b), ("a", a)):  # one hub serving both: its calls are a's
            server.hub.channels.tool_kinds["probe"] = self._kind(name)

    def owner(self) -> ToolExecutor:
        """The grant's own executor on ``a``, its owner."""
        return self._kind("a")("", {})

    def _kind(self, replica: str) -> ToolKind:
        def make(grant_id: str, tools: dict[str, Any]) -> ToolExecutor:
            async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
                self.ran.append((replica, tool_id))
                if arguments.get("hold"):
                    await asyncio.to_thread(self.release.wait, 10)
                if arguments.get("refuse"):
                    raise TalariaError("team_tools_forbidden", "team tools are no longer available to this turn")
                return {"ran": tool_id, "on": replica, "grant": grant_id, "tools": tools}

            return execute

        return make


def account_ref(server: HubServer, username: str) -> AccountRef:
    record = server.hub.accounts.get(username)
    assert record is not None, username
    return AccountRef(record.username, record.tenant, record.auth_version)


def take(machine: Machine, kind: str) -> dict[str, Any]:
    """The one command of ``kind`` the next poll through ``machine`` delivers."""
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert command["kind"] == kind, command
    return dict(command)


def answered(server: HubServer, machine: Machine, task: asyncio.Task[Any], kind: str) -> Any:
    """The outcome at ``server`` of ``task``, whose one command (of ``kind``) is taken, admitted and answered
    through ``machine`` (a client of the same replica or of another one)."""
    command = take(machine, kind)
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": True}
    assert_machine_ok(machine.post("result", {"id": command["id"], "result": {"ok": True}}))
    return outcome(server, task)


def probe_grant(server: HubServer, machine: Machine, tools: ProbeTools, account: AccountRef) -> Grant:
    """A grant opened by ``server`` on ``machine``'s runner (executor and ``tools`` of kind ``probe``)."""
    created = server.hub.channels.create_grant(
        machine.runner_id, account, profile="default", work_id="w1", session={"runtimeId": "r", "storedId": ""},
        catalog=[], executor=tools.owner(), turn_active=lambda: True, tools={"kind": "probe", "n": 1},
    )  # fmt: skip
    grant = answered(server, machine, spawn(server, created), "grant.create")
    assert isinstance(grant, Grant), grant
    return grant


def round_grant(server: HubServer, machine: Machine, round: Round) -> Grant:
    """The grant of ``round`` (a chat turn's team catalog), opened by ``server`` on ``machine``'s runner as the turn
    driver opens it: created, then described, its calls run by the hub's team tool frame (the ``round`` tool kind)
    on whichever replica they reach."""
    executors: list[ToolExecutor] = []

    async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
        return await executors[0](tool_id, arguments)

    channels = server.hub.channels
    assert ROUND_KIND in channels.tool_kinds, "the hub has the team set installed"
    account = AccountRef(round.owner, round.tenant, round.auth_version)
    created = channels.create_grant(
        machine.runner_id, account, profile=round.profile, work_id=round.conversation_id,
        session={"runtimeId": "r", "storedId": ""}, catalog=[], executor=execute, turn_active=lambda: True,
    )  # fmt: skip
    grant = answered(server, machine, spawn(server, created), "grant.create")
    assert isinstance(grant, Grant), grant
    tools = {"kind": ROUND_KIND, "round": dataclasses.asdict(dataclasses.replace(round, grant_id=grant.id))}
    server.call(channels.describe_grant(grant, tools))
    executors.append(channels.tool_kinds[ROUND_KIND](grant.id, tools))
    return grant


def call(grant: Grant, call_id: str, tool_id: str = "probe.echo", **arguments: Any) -> dict[str, Any]:
    """A ``tool`` request body."""
    return {"grantId": grant.id, "toolId": tool_id, "callId": call_id, "arguments": arguments}
