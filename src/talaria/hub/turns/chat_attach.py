"""A turn's attachments sent to its Hermes session (chat.md 3.4, 5.3 step 7): one RPC each, in upload order,
before the submit record. An image goes as ``image.attach_bytes {session_id, content_base64, filename}``, a file as
``file.attach {session_id, data_url, name}`` (never a ``path``) whose ``ref_text`` joins the prompt. Once its RPC
went to the runner an attachment is ``sent``: its bytes are dropped and where it went is kept."""

from __future__ import annotations

import asyncio
import base64

from talaria.chat.attachments import Attachment
from talaria.clock import Clock
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import Gateway
from talaria.store.interface import Store


def _pending(store: Store, conversation_id: str, message_id: str) -> list[tuple[Attachment, bytes]]:
    with store.read() as tx:
        rows = [r for r in tx.all("chat_attachment_of_messages", conversation_id=conversation_id)
                if r["message_id"] == message_id and r["state"] == "attached"]  # fmt: skip
        out = []
        for row in rows:
            data = tx.one("chat_attachment_data", id=row["id"])
            out.append((Attachment.from_row(row), bytes(data["data"]) if data and data["data"] is not None else b""))
    return out


def _sent(store: Store, clock: Clock, attachment_id: str, runner_id: str, node_path: str | None) -> None:
    with store.write() as tx:
        tx.run("chat_attachment_sent", id=attachment_id, runner_id=runner_id, node_path=node_path, now=clock.now_ms())


async def send_attachments(
    channels: Channels, gateway: Gateway, store: Store, clock: Clock, *, runtime_id: str, runner_id: str,
    conversation_id: str, message_id: str,
) -> list[str]:  # fmt: skip
    """Send the message's attachments; returns the ``ref_text`` lines of its files. A refused or uncertain RPC
    raises (the turn then ends ``failed`` before anything is submitted)."""
    refs: list[str] = []
    for attachment, data in await asyncio.to_thread(_pending, store, conversation_id, message_id):
        encoded = base64.b64encode(data).decode("ascii")
        if attachment.kind == "image":
            params = {"session_id": runtime_id, "content_base64": encoded, "filename": attachment.name}
            answer = await channels.rpc(gateway, "image.attach_bytes", params)
        else:
            data_url = f"data:{attachment.media_type};base64,{encoded}"
            params = {"session_id": runtime_id, "data_url": data_url, "name": attachment.name}
            answer = await channels.rpc(gateway, "file.attach", params)
            ref = answer.get("ref_text") if isinstance(answer, dict) else None
            if isinstance(ref, str) and ref:
                refs.append(ref)
        path = answer.get("path") if isinstance(answer, dict) else None
        await asyncio.to_thread(_sent, store, clock, attachment.id, runner_id, path if isinstance(path, str) else None)
    return refs
