"""Compression during a binding (hermes.md 6, 8): Hermes rotates the stored session id under the same
runtime id in the middle of a turn, and the bound team tool keeps working for that session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.testing.model_server import ModelServer, ToolSelector, reply_with_tool_result, tool_call, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.conftest import Node, running_node
from tests.hermes.sessions import Session

# Rotate the stored id on compression (0.19.0 compresses in place by default) and allow it from turn 2.
COMPRESSION = "compression:\n  protect_first_n: 0\n  in_place: false\n"


@pytest.fixture
def compressing(tmp_path: Path, model: ModelServer, hermes_executable: Path) -> Iterator[Node]:
    hermes = RealHermes(tmp_path / "hermes", model.base_url, config_extra=COMPRESSION)
    with hermes, running_node(tmp_path, hermes, model) as made:
        yield made


def test_a_compression_during_a_bound_turn_keeps_the_tool_with_its_session(compressing: Node) -> None:
    node = compressing
    session = Session.open(node)
    session.start("warm up")
    session.wait_idle()
    stored_before = session.stored_id
    session.bind(work_id="job-c")
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
