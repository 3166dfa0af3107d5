"""Team tools on real Hermes (hermes.md 8): a grant bound to one session is visible and callable there only,
gone after unbind, and opaque per grant."""

from __future__ import annotations

import json

from talaria.testing.model_server import ToolSelector, reply, slow, tool_call, when
from tests.hermes.conftest import Node
from tests.hermes.sessions import Session
from tests.hermes.team_support import TEAM, offered_team_tools, requests_with, tool_results


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
