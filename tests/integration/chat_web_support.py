"""Chats made through the JSON API of a ``Web`` hub whose bot node is registered but not connected, for the chat
route tests."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.web_support import Web


def chat(web: Web, client: httpx.Client | None = None) -> str:
    """A conversation of ``client`` (uma's by default) with a bot on the offline node ``node-1``."""
    client = client or web.user
    if not web.server.hub.registry.for_source("default", "local"):
        node = web.admin.post("/api/admin/runners", json={"name": "node-1", "source": "local",
                                                           "allowedProfiles": ["default"]})  # fmt: skip
        assert node.status_code == 201, node.text
    bots = client.get("/api/bots").json()["bots"]
    bot_id = bots[0]["id"] if bots else client.post(
        "/api/bots", json={"name": "Helper", "source": "local", "profile": "default"}).json()["bot"]["id"]  # fmt: skip
    made = client.post("/api/conversations", json={"botId": bot_id})
    assert made.status_code == 201, made.text
    conversation_id: str = made.json()["conversation"]["id"]
    return conversation_id


def send(client: httpx.Client, conversation_id: str, body: Any, **headers: str | bytes) -> httpx.Response:
    return client.post(f"/api/conversations/{conversation_id}/turns", json=body, headers=headers)
