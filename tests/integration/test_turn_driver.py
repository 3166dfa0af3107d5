"""The minimal turn driver over real sockets: hub → runner process → Hermes fixture, with a tool grant and
``talaria_whoami`` answering the identity the hub bound, whatever the caller puts in the arguments."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import ManualClock, SystemClock
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import AccountRef, EncodedResult
from talaria.hub.turns.driver import TurnDriver, TurnResult
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.runner_support import RunnerProcess, outcome, register_node, spawn, wait_until


@dataclass
class Env:
    server: HubServer
    hermes: HermesFixture
    runner_id: str
    account: AccountRef
    driver: TurnDriver

    def turn(self, driver: TurnDriver | None = None, **kwargs: Any) -> asyncio.Task[Any]:
        driver = driver or self.driver
        args: dict[str, Any] = {"runner_id": self.runner_id, "account": self.account, "profile": "default",
                                "work_id": "work-42", "prompt": "hello",
                                "deadline_ms": driver.clock.now_ms() + 120_000} | kwargs  # fmt: skip
        return spawn(self.server, driver.run(**args))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        runner: RunnerProcess | None = None
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            created = server.hub.accounts.get("alice")
            assert created is not None
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner = RunnerProcess(path, tmp_path / "logs")
            runner.wait_for("runner connected")
            runner_id = json.loads(path.read_text())["runnerId"]
            wait_until(lambda: server.hub.runners.is_connected(runner_id), what="the hub state")
            account = AccountRef("alice", created.tenant, created.auth_version)
            yield Env(
                server, hermes, runner_id, account, TurnDriver(server.hub.channels, server.hub.registry, server.clock)
            )
        finally:
            if runner is not None:
                runner.stop()
                runner.close()
            server.stop()


def listener_call(bind: dict[str, Any], path: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {bind['token']}"}
    response = httpx.post(f"{bind['bridge_url']}{path}", json=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_turn_streams_to_message_complete_and_whoami_answers_the_bound_identity(env: Env) -> None:
    env.hermes.knobs.delta_delay = 0.3  # the turn stays in flight while the test calls the tool
    task = env.turn()
    wait_until(lambda: len(env.hermes.bindings()) == 1, what="the grant to be bound")
    bind = next(iter(env.hermes.bindings().values()))
    tools = listener_call(bind, "/tools/list", {})["tools"]
    assert [t["name"] for t in tools] == ["talaria_whoami"] and tools[0]["id"].startswith("team_")
    spoof = {"account": "mallory", "tenant": "evil", "workId": "other", "grantId": "x"}
    answer = listener_call(bind, "/tools/call", {"toolId": tools[0]["id"], "arguments": spoof, "callId": "c1"})
    identity = answer["structuredContent"]
    assert identity["account"] == "alice" and identity["tenant"] == env.account.tenant
    assert (identity["source"], identity["profile"], identity["workId"]) == ("local", "default", "work-42")
    assert [identity["grantId"]] == list(env.server.hub.runners.state_of(env.runner_id).grants)
    result = outcome(env.server, task, timeout=30)
    assert isinstance(result, TurnResult), result
    assert result.status == "complete"
    assert result.marker.startswith("[talaria-run:") and result.marker.endswith(":work-42]")
    assert result.text == f"echo: hello\n{result.marker}"
    assert "".join(result.deltas()) == result.text
    assert env.hermes.prompt_count(result.marker) == 1
    # the grant is closed with the turn: unbound in Hermes, and the listener is gone
    wait_until(lambda: env.hermes.bindings() == {}, what="the unbind")
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{bind['bridge_url']}/tools/list", json={}, timeout=2)


def test_a_plugin_that_is_not_ready_refuses_team_tools_before_anything_is_submitted(env: Env) -> None:
    env.hermes.knobs.capabilities = env.hermes.knobs.capabilities | {"ready": False, "missing": ["_sessions"]}
    result = outcome(env.server, env.turn(), timeout=30)
    assert isinstance(result, TalariaError) and result.code == "team_tools_unavailable"
    assert "_sessions" in result.message
    assert env.hermes.rpc_requests("prompt.submit") == []
    wait_until(lambda: env.server.hub.runners.state_of(env.runner_id).gateways == {}, what="the gateway to close")


def _tool_call(bind: dict[str, Any], call_id: str) -> dict[str, Any]:
    tool = listener_call(bind, "/tools/list", {})["tools"][0]
    return listener_call(bind, "/tools/call", {"toolId": tool["id"], "arguments": {}, "callId": call_id})


def test_revoking_the_account_mid_turn_fails_the_next_tool_call_and_interrupts_the_turn(env: Env) -> None:
    env.hermes.knobs.delta_count = 3
    env.hermes.knobs.delta_delay = 10  # no event reaches the hub for a while: only the tool call can notice
    task = env.turn(prompt="a tooled turn")
    wait_until(lambda: len(env.hermes.bindings()) == 1, what="the grant to be bound")
    bind = next(iter(env.hermes.bindings().values()))
    assert _tool_call(bind, "c1")["structuredContent"]["account"] == "alice"
    env.server.hub.accounts.update("alice", "default", {"allowedProfiles": {"local": []}})  # auth_version + 1
    refused = _tool_call(bind, "c2")
    assert refused["isError"] is True and json.loads(refused["content"][0]["text"])["code"] == "team_tools_forbidden"
    result = outcome(env.server, task, timeout=5)  # well before the next event
    assert isinstance(result, TalariaError) and result.code == "access_revoked", result
    env.hermes.wait_for(lambda: next(t for t in env.hermes.turns() if "tooled" in t.text).status == "interrupted")
    wait_until(lambda: env.hermes.unbinds() != [], what="the grant to be closed")


@dataclass
class Refusing:
    """A turn's own tool set (the driver's ``ToolSet``): answers pre-encoded text until ``refuse`` is set, then
    ``team_tools_forbidden`` as a round whose permission went away does; ``valid`` as the round's renewal sees it."""

    refuse: bool = False
    grant_id: str = ""
    calls: int = 0

    @property
    def catalog(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {}, "additionalProperties": False}
        return [{"id": "talaria_probe", "name": "talaria_probe", "description": "a probe", "inputSchema": schema}]

    async def opened(self, grant_id: str) -> None:
        self.grant_id = grant_id

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> Any:
        self.calls += 1
        if self.refuse:
            raise TalariaError("team_tools_forbidden", "team tools are no longer available to this turn")
        return EncodedResult('{"zeta":"' + self.grant_id + '","alpha":"é"}')

    def descriptor(self) -> dict[str, Any]:
        return {"kind": "probe"}  # no replica other than this hub runs its calls

    async def valid(self) -> bool:
        return not self.refuse


def test_a_tool_set_s_text_reaches_the_caller_in_its_key_order(env: Env) -> None:
    env.hermes.knobs.delta_count, env.hermes.knobs.delta_delay = 100, 1.0  # held until the call was answered
    tools = Refusing()
    task = env.turn(toolset=tools)
    wait_until(lambda: len(env.hermes.bindings()) == 1, what="the grant to be bound")
    bind = next(iter(env.hermes.bindings().values()))
    answer = _tool_call(bind, "c1")
    env.hermes.knobs.delta_delay = 0
    assert answer["content"][0]["text"] == '{"zeta":"' + tools.grant_id + '","alpha":"é"}'
    assert answer["structuredContent"] == {"zeta": tools.grant_id, "alpha": "é"}
    assert isinstance(outcome(env.server, task, timeout=30), TurnResult)


def test_a_tool_that_refuses_the_round_closes_the_grant_and_the_turn_goes_on(env: Env) -> None:
    env.hermes.knobs.delta_count, env.hermes.knobs.delta_delay = 100, 1.0  # held until the grant closed
    tools = Refusing()
    task = env.turn(toolset=tools, prompt="tools then none")
    wait_until(lambda: len(env.hermes.bindings()) == 1, what="the grant to be bound")
    bind = next(iter(env.hermes.bindings().values()))
    assert "isError" not in _tool_call(bind, "c1")
    tools.refuse = True
    refused = _tool_call(bind, "c2")
    assert refused["isError"] is True and json.loads(refused["content"][0]["text"])["code"] == "team_tools_forbidden"
    wait_until(lambda: env.hermes.unbinds() != [], what="the grant to be closed")
    assert env.server.hub.runners.state_of(env.runner_id).grants == {}
    with pytest.raises(httpx.TransportError):  # the listener went with the grant: no later call reaches a tool
        httpx.post(f"{bind['bridge_url']}/tools/list", json={}, timeout=2)
    env.hermes.knobs.delta_delay = 0
    result = outcome(env.server, task, timeout=30)
    assert isinstance(result, TurnResult) and result.status == "complete", result  # not interrupted
    assert tools.calls == 2


def test_a_renewal_that_finds_the_round_gone_closes_the_grant_and_the_turn_goes_on(env: Env) -> None:
    driver = TurnDriver(env.server.hub.channels, env.server.hub.registry, env.server.clock, grant_renew_s=0.2)
    env.hermes.knobs.delta_count = 3
    env.hermes.knobs.delta_delay = 1
    tools = Refusing(refuse=True)
    task = env.turn(driver, toolset=tools, prompt="renewal closes")
    wait_until(lambda: env.hermes.unbinds() != [], what="the renewal to close the grant")
    result = outcome(env.server, task, timeout=30)
    assert isinstance(result, TurnResult) and result.status == "complete", result
    assert tools.calls == 0


def test_the_grant_is_renewed_while_the_account_holds_and_its_turn_stops_once_it_does_not(env: Env) -> None:
    driver = TurnDriver(env.server.hub.channels, env.server.hub.registry, env.server.clock, grant_renew_s=0.2)
    env.hermes.knobs.delta_count = 3
    env.hermes.knobs.delta_delay = 10  # no event reaches the hub for a while: only the renewal can notice
    task = env.turn(driver, prompt="renew me")
    wait_until(lambda: len(env.hermes.binds()) >= 3, what="two renewals (grant.bind) after the first bind")
    env.server.hub.accounts.update("alice", "default", {"enabled": False})
    result = outcome(env.server, task, timeout=5)  # no tool call needed: the renewal's check stops it
    assert isinstance(result, TalariaError) and result.code == "access_revoked", result
    env.hermes.wait_for(lambda: next(t for t in env.hermes.turns() if "renew me" in t.text).status == "interrupted")


def test_a_turn_longer_than_ten_minutes_runs_to_its_end_inside_its_deadline(env: Env) -> None:
    """The old driver cut every turn at a fixed 600 s; a turn may now run until its deadline."""
    clock = ManualClock()
    driver = TurnDriver(env.server.hub.channels, env.server.hub.registry, clock)
    env.hermes.knobs.delta_count = 8
    env.hermes.knobs.delta_delay = 0.2
    task = env.turn(driver, tools=False, prompt="a long one", deadline_ms=clock.now_ms() + 3600_000)
    env.hermes.wait_for(lambda: env.hermes.prompt_count("a long one") == 1)
    clock.advance(700)  # past the old fixed cap, well inside the deadline
    result = outcome(env.server, task, timeout=30)
    assert isinstance(result, TurnResult) and result.status == "complete", result
    assert result.text.startswith("echo: a long one\n[talaria-run:")
    assert env.hermes.rpc_requests("session.interrupt") == []


def test_a_turn_that_reaches_its_deadline_is_interrupted_and_raises_turn_timeout(env: Env) -> None:
    clock = ManualClock()
    driver = TurnDriver(env.server.hub.channels, env.server.hub.registry, clock)
    env.hermes.knobs.delta_count = 100
    env.hermes.knobs.delta_delay = 0.2  # 20 s unless stopped
    task = env.turn(driver, tools=False, prompt="too long", deadline_ms=clock.now_ms() + 900_000)
    env.hermes.wait_for(lambda: env.hermes.prompt_count("too long") == 1)
    clock.advance(899)
    assert env.hermes.rpc_requests("session.interrupt") == []
    clock.advance(2)
    result = outcome(env.server, task, timeout=10)
    assert isinstance(result, TalariaError) and result.code == "turn_timeout", result
    assert "turns.max_turn_s" in result.message
    assert env.hermes.rpc_requests("session.interrupt")  # the driver stops it (closing the channel does too)
    env.hermes.wait_for(lambda: next(t for t in env.hermes.turns() if "too long" in t.text).status == "interrupted")


def test_a_turn_without_tools_binds_nothing(env: Env) -> None:
    result = outcome(env.server, env.turn(tools=False, prompt="plain"), timeout=30)
    assert isinstance(result, TurnResult) and result.text.startswith("echo: plain\n[talaria-run:")
    assert env.hermes.binds() == []


def test_admins_read_the_node_s_hermes_version_and_team_tool_readiness(env: Env) -> None:
    add_account(env.server, "root", "admin", allowed_profiles={"local": ["default"]})
    admin = login(env.server, "root")
    try:
        answer = admin.get(f"/api/admin/runners/{env.runner_id}/hermes")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["hermes"] == {"version": "0.19.0", "authRequired": False}
        assert body["teamTools"]["ready"] is True and body["teamTools"]["missing"] == []
        env.hermes.knobs.capabilities = env.hermes.knobs.capabilities | {"ready": False, "missing": ["_sessions"]}
        later = admin.get(f"/api/admin/runners/{env.runner_id}/hermes").json()
        assert later["teamTools"]["ready"] is False and later["teamTools"]["missing"] == ["_sessions"]
        assert env.hermes.session_token not in answer.text
        assert admin.get("/api/admin/runners/00000000-0000-4000-8000-000000000000/hermes").status_code == 404
    finally:
        admin.close()
    user = login(env.server, "alice")
    try:
        assert user.get(f"/api/admin/runners/{env.runner_id}/hermes").status_code == 403
    finally:
        user.close()


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_an_admin_test_turn_streams_hermes_events_then_done(env: Env) -> None:
    add_account(env.server, "root", "admin", allowed_profiles={"local": ["default"]})
    admin = login(env.server, "root")
    try:
        url = f"/api/admin/runners/{env.runner_id}/test-turn"
        with admin.stream("POST", url, json={"prompt": "ping", "tools": True}) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response.read().decode())
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "done" and "event" in kinds
        deltas = "".join(d["payload"]["text"] for k, d in events if k == "event" and d["type"] == "message.delta")
        done = events[-1][1]
        assert done["status"] == "complete" and done["text"] == deltas == f"echo: ping\n{done['marker']}"
        assert ":test-turn:" in done["marker"]
        # bad bodies are refused before anything is sent to the node, limits at their edge
        assert admin.post(url, json={"prompt": "x" * 4000, "tools": False}).status_code == 200
        bad: list[dict[str, Any]] = [{"prompt": "x" * 4001}, {"prompt": ""}, {"prompt": "hi", "extra": 1},
                                     {"prompt": "hi", "tools": 1}]  # fmt: skip
        for body in bad:
            refused = admin.post(url, json=body)
            assert refused.status_code == 400 and refused.json()["code"] == "invalid_request", body
        assert env.hermes.prompt_count("x" * 4001) == 0
    finally:
        admin.close()
    user = login(env.server, "alice")
    try:
        assert user.post(f"/api/admin/runners/{env.runner_id}/test-turn", json={"prompt": "hi"}).status_code == 403
    finally:
        user.close()


def test_an_admin_without_the_node_s_profile_reads_its_hermes_version_and_nothing_is_asked_for_the_profile(
    env: Env,
) -> None:
    add_account(env.server, "rooty", "admin")  # no allowed profiles at all
    admin = login(env.server, "rooty")
    try:
        answer = admin.get(f"/api/admin/runners/{env.runner_id}/hermes")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["hermes"] == {"version": "0.19.0", "authRequired": False}
        assert body["teamTools"]["checked"] is False and body["teamTools"]["ready"] is False
        assert "default" in body["teamTools"]["reason"]
        assert env.hermes.requests("/api/plugins/talaria/capabilities") == []  # checked first, never sent
    finally:
        admin.close()


def test_a_test_turn_is_refused_before_streaming_for_a_profile_the_admin_may_not_use_or_an_offline_node(
    env: Env, tmp_path: Path
) -> None:
    add_account(env.server, "root", "admin", allowed_profiles={"local": ["default"]})
    admin = login(env.server, "root")
    try:
        url = f"/api/admin/runners/{env.runner_id}/test-turn"
        refused = admin.post(url, json={"prompt": "hi", "profile": "research"})
        assert refused.status_code == 403 and refused.json()["code"] == "profile_not_allowed", refused.text
        assert refused.headers["content-type"].startswith("application/json")
        add_account(env.server, "root2", "admin", allowed_profiles={"lab": ["default"]})
        path = register_node(env.server, tmp_path / "lab", hermes_url=env.hermes.url,
                             session_token=env.hermes.session_token, name="lab", source="lab")  # fmt: skip
        offline_id = json.loads(path.read_text())["runnerId"]
        other = login(env.server, "root2")
        try:
            offline = other.post(f"/api/admin/runners/{offline_id}/test-turn", json={"prompt": "hi"})
            assert offline.status_code == 503 and offline.json()["code"] == "runner_offline", offline.text
        finally:
            other.close()
        assert env.hermes.prompt_count("hi") == 0
    finally:
        admin.close()
