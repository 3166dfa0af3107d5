"""What the team-tool tests on real Hermes share: which team tools a model request offered, the requests that
carry a text, and the tool results a request sent back."""

from __future__ import annotations

import json

from talaria.testing.model_server import LoggedRequest
from tests.hermes.conftest import Node

TEAM = "team_"


def offered_team_tools(request: LoggedRequest) -> list[str]:
    return [name for name in request.tools if name.startswith(TEAM)]


def requests_with(node: Node, text: str) -> list[LoggedRequest]:
    return [r for r in node.model.chat_requests() if r.tools and any(text in json.dumps(m) for m in r.body["messages"])]


def tool_results(request: LoggedRequest) -> list[str]:
    return [str(m.get("content")) for m in request.body["messages"] if m.get("role") == "tool"]
