"""Compression during a binding (hermes.md 6, 8): Hermes rotates the stored session id under the same
runtime id in the middle of a turn, and the bound team tool keeps working for that session, and only for it:
another session opened on the rotated-out stored id never gets it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from talaria.testing.model_server import (
    LoggedRequest,
    ModelServer,
    ToolSelector,
    hang,
    reply,
    reply_with_tool_result,
    tool_call,
    when,
)
from talaria.testing.real_hermes import RealHermes
from tests.hermes.conftest import Node, running_node
from tests.hermes.sessions import Session
from tests.hermes.team_support import TEAM, offered_team_tools, requests_with, tool_results

# Rotate the stored id on compression (0.19.0 compresses in place by default) and allow it from turn 2.
COMPRESSION = "compression:\n  protect_first_n: 0\n  in_place: false\n"


WHOAMI = ToolSelector(TEAM, "talaria_whoami")


@pytest.fixture
def compressing(
    request: pytest.FixtureRequest, tmp_path: Path, model: ModelServer, hermes_executable: Path
) -> Iterator[Node]:
    """A node whose Hermes rotates stored ids on compression; an indirect parameter is Hermes' extra environment."""
    env: dict[str, str] = getattr(request, "param", None) or {}
    hermes = RealHermes(tmp_path / "hermes", model.base_url, config_extra=COMPRESSION, env=env)
    with hermes, running_node(tmp_path, hermes, model) as made:
        yield made


def test_a_compression_during_a_bound_turn_keeps_the_tool_with_its_session(compressing: Node) -> None:
    node = compressing
    session = Session.warmed_and_bound(node, "job-c")
    stored_before = session.stored_id
    node.model.script(
        when(
            "compress now",
            tool_call("todo", {}, prompt_tokens=120_000),  # ≥ 75 % of the 128,000 context: Hermes compresses
            tool_call(ToolSelector("team_", "talaria_whoami"), {}),
            reply_with_tool_result("after compression: "),
        )
    )
    session.start("compress now")
    events = session.collect_until_idle()
    infos = [e["payload"] for e in events if e["type"] == "session.info" and "stored_session_id" in e["payload"]]
    assert infos and infos[-1]["stored_session_id"] != stored_before, "Hermes did not rotate the stored id"
    assert {e["session_id"] for e in events} == {session.runtime_id}  # the runtime id stays
    complete = next(e["payload"] for e in events if e["type"] == "message.complete")
    assert complete["usage"].get("compressions", 0) >= 1
    assert complete["text"].startswith("after compression: ")
    identity = json.loads(complete["text"].removeprefix("after compression: "))
    assert identity["account"] == "alice" and identity["workId"] == "job-c"
    assert any(r.body["messages"][0]["content"].startswith("You are a summarization agent") for r in
               node.model.chat_requests())  # fmt: skip
    session.unbind()
    session.close()


def holds_tool_result(text: str) -> Callable[[list[LoggedRequest]], bool]:
    """A predicate over the model log: some request carries a tool result containing ``text``."""

    def check(log: list[LoggedRequest]) -> bool:
        return any(
            m.get("role") == "tool" and text in str(m.get("content"))
            for r in log
            if r.path == "/v1/chat/completions"
            for m in r.body["messages"]
        )

    return check


@pytest.mark.parametrize(
    "compressing",
    [{}, {"HERMES_TUI_TOOLSETS": "all"}],  # "all": agents start with every registered toolset (no explicit list)
    ids=["configured-toolsets", "all-toolsets"],
    indirect=True,
)
def test_a_session_resumed_on_a_rotated_out_id_never_gets_the_other_bindings_tools(compressing: Node) -> None:
    """Defect 7: A (alice, job-a) is bound and compresses mid-turn, so its stored id moves from K1 to K2
    while Hermes still keys it on K1 until the turn ends. B (bob, job-b), resumed on K1 during that turn and
    bound to its own grant, is offered only its own tool, cannot reach A's, and closing B leaves A's alone."""
    node = compressing
    a = Session.warmed_and_bound(node, "job-a")
    k1 = a.stored_id
    node.model.script(
        when(
            "alpha compress",
            tool_call("todo", {}, prompt_tokens=120_000),  # ≥ 75 % of the context: Hermes compresses
            tool_call(WHOAMI, {}),  # A's own tool, after the rotation
            hang(),  # A's turn stays running (its gateway key still K1) until the interrupt below
        )
    )
    a.start("alpha compress")
    node.model.wait_for(holds_tool_result("job-a"), timeout=60)
    chat = node.model.chat_requests()
    a_name = offered_team_tools(next(r for r in chat if r.last_user == "alpha compress"))[0]
    summary = next(i for i, r in enumerate(chat) if str(r.body["messages"][0].get("content")).startswith(
        "You are a summarization agent"))  # fmt: skip
    assert summary < len(chat) - 1, "Hermes did not compress before A's tool call"

    b = Session.resume(node, k1, account="bob", lazy=True)
    assert b.runtime_id != a.runtime_id, "Hermes re-attached the resume to A"
    b.bind(work_id="job-b")
    node.model.script(when("beta turn", tool_call(a_name, {}), tool_call(WHOAMI, {}), reply("beta done")))
    b.start("beta turn")
    assert b.wait_idle()["text"] == "beta done"
    beta = requests_with(node, "beta turn")
    refusal, own = tool_results(beta[-1])[-2:]
    # nothing of A's grant reached B, and A's tool is not even in B's snapshot (Hermes' own gate answers)
    assert "job-a" not in refusal and "alice" not in refusal, refusal
    assert "does not exist" in refusal, refusal
    offered = {name for r in beta for name in offered_team_tools(r)}
    assert a_name not in offered and len(offered) == 1, (a_name, offered)
    identity = json.loads(own)
    assert identity["account"] == "bob" and identity["workId"] == "job-b", identity
    b.unbind()
    assert b.rpc("session.close", {"session_id": b.runtime_id})["closed"] is True  # finalized under K1, A's old id
    b.close()

    a.interrupt()
    events = a.collect_until_idle()
    infos = [e["payload"] for e in events if e["type"] == "session.info" and "stored_session_id" in e["payload"]]
    assert infos and infos[-1]["stored_session_id"] != k1, "Hermes did not rotate A's stored id"
    node.model.script(when("alpha again", tool_call(WHOAMI, {}), reply_with_tool_result("alpha: ")))
    a.start("alpha again")
    complete = a.wait_idle()
    assert {n for r in requests_with(node, "alpha again") for n in offered_team_tools(r)} == {a_name}
    assert complete["text"].startswith("alpha: "), complete["text"]
    identity = json.loads(complete["text"].removeprefix("alpha: "))
    assert identity["account"] == "alice" and identity["workId"] == "job-a"
    a.unbind()
    a.close()
