"""The node's rules on real Hermes: interrupt, profile filtering (account ∩ runner), the allow-lists and
export under artifactRoots (runner-protocol.md 10, 11; hermes.md 4, 5)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.errors import TalariaError
from talaria.hub.turns import team_tools
from talaria.hub.turns.driver import TurnResult
from talaria.testing.model_server import ModelServer, reply, slow, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.conftest import Node, running_node
from tests.hermes.sessions import Session


def test_interrupt_stops_a_slow_turn_within_five_seconds(node: Node) -> None:
    node.model.script(when("long story", slow("word " * 400, chunk_delay_s=0.5)))  # about 100 s if left alone
    session = Session.open(node)
    session.start("long story")
    node.model.wait_for(lambda log: any(r.last_user == "long story" for r in log), timeout=60)
    assert session.interrupt() == {"status": "interrupted"}
    complete = session.wait_idle(timeout=5.0)
    assert complete["status"] == "interrupted"
    session.close()


def test_profiles_are_the_account_s_intersected_with_the_runner_s(node: Node) -> None:
    node.model.script(when("in work", reply("working")))
    result = node.turn("in work", profile="work", tools=False)
    assert isinstance(result, TurnResult) and result.text == "working"
    refused = node.turn("bob in work", profile="work", account=node.account("bob"), tools=False)
    assert isinstance(refused, TalariaError) and refused.code == "runner_command_not_admitted"
    assert not any("bob in work" in (r.last_user or "") for r in node.model.chat_requests())


def test_a_method_off_the_allow_list_and_a_post_are_refused(node: Node) -> None:
    session = Session.open(node)
    off_list = session.rpc("session.cwd.set", {"session_id": session.runtime_id, "cwd": "/"})
    assert isinstance(off_list, TalariaError) and off_list.code == "runner_command_forbidden"
    session.close()
    post = node.call(
        node.server.hub.runners.send(
            node.runner_id, "http", {"path": "/api/config", "method": "POST", "search": ""},
            account=node.account(), profile=None,
        )
    )  # fmt: skip
    assert isinstance(post, TalariaError) and post.code == "runner_http_forbidden"


@pytest.fixture
def export_node(tmp_path: Path, hermes: RealHermes, model: ModelServer) -> Iterator[tuple[Node, Path]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    with running_node(tmp_path, hermes, model, artifactRoots=[str(root)]) as made:
        yield made, root


def test_export_inside_an_artifact_root_works_and_outside_is_refused(export_node: tuple[Node, Path]) -> None:
    node, root = export_node
    inside = root / "report.txt"
    inside.write_text("the report\n")
    outside = root.parent / "secret.txt"
    outside.write_text("not for export\n")
    channels = node.server.hub.channels
    answer = node.call(channels.http(node.runner_id, node.account(), "/api/files/download", search=f"?path={inside}"))
    assert answer["status"] == 200, answer
    assert base64.b64decode(answer["body"]) == b"the report\n"
    for path in (outside, root / ".." / "secret.txt", root / "missing.txt"):
        refused = node.call(
            channels.http(node.runner_id, node.account(), "/api/files/download", search=f"?path={path}")
        )
        assert isinstance(refused, TalariaError) and refused.code == "runner_artifact_forbidden", (path, refused)


@pytest.fixture
def safe_mode_node(tmp_path: Path, model: ModelServer, hermes_executable: Path) -> Iterator[Node]:
    """A Hermes in safe mode: the plugin's routes load but its hooks do not (hermes.md 8)."""
    hermes = RealHermes(tmp_path / "hermes", model.base_url, env={"HERMES_SAFE_MODE": "1"})
    with hermes, running_node(tmp_path, hermes, model) as made:
        yield made


def test_a_plugin_without_its_hooks_is_not_ready_and_nothing_is_bound_or_submitted(safe_mode_node: Node) -> None:
    node = safe_mode_node
    result = node.turn("never submitted")
    assert isinstance(result, TalariaError) and result.code == "team_tools_unavailable", result
    assert not any("never submitted" in (r.last_user or "") for r in node.model.chat_requests())
    plain = node.turn("plain turn", tools=False)
    assert isinstance(plain, TurnResult) and plain.status == "complete"
    # without the hub's probe, the runner's own capability check refuses the bind
    session = Session.open(node)
    payload = {"runtimeId": session.runtime_id, "storedId": session.stored_id}

    async def bind_directly() -> None:
        channels = node.server.hub.channels

        async def execute(tool_id: str, arguments: dict[str, object]) -> object:
            raise AssertionError("no tool may run")

        grant = await channels.create_grant(
            node.runner_id, node.account(), profile="default", work_id="w", session=payload,
            catalog=team_tools.catalog(), executor=execute, turn_active=lambda: True,
        )  # fmt: skip
        await channels.bind_grant(grant, payload)

    refused = node.call(bind_directly())
    assert isinstance(refused, TalariaError) and refused.code == "team_tools_unavailable", refused
    session.close()
