"""``image.attach_bytes`` and ``file.attach``: uploads are written under the fixture's home, as Hermes writes them
into its own directories (hermes.md 4). Runs on the server loop only.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from typing import Any

from talaria.testing.hermes_fixture.state import FixtureState, LiveSession, RpcError

MAX_ATTACH_BYTES = 25 * 1024 * 1024
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"})
_MAGIC = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"GIF8", ".gif"), (b"BM", ".bmp"))
_DATA_URL = re.compile(r"^data:([^;,]*)(;base64)?,(.*)\Z", re.DOTALL)


def decode_base64(raw: str) -> bytes | None:
    """Base64 with an optional ``data:…;base64,`` prefix and embedded whitespace; None when invalid."""
    if raw.startswith("data:") and "," in raw:
        raw = raw.split(",", 1)[1]
    compact = "".join(raw.split())
    compact += "=" * (-len(compact) % 4)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return None


def _image_extension(data: bytes, hint: str) -> str:
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    suffix = Path(hint).suffix.lower() if hint else ""
    return suffix or ".png"


def attach_image(state: FixtureState, session: LiveSession, params: dict[str, Any]) -> dict[str, Any]:
    raw = str(params.get("content_base64") or params.get("data") or "").strip()
    if not raw:
        raise RpcError(4015, "content_base64 required")
    data = decode_base64(raw)
    if data is None:
        raise RpcError(4017, "data is not valid base64")
    if not data:
        raise RpcError(4017, "image is empty")
    if len(data) > MAX_ATTACH_BYTES:
        raise RpcError(4018, f"image too large ({len(data)} bytes; cap is 25 MB)")
    ext_hint = str(params.get("ext") or "").strip().lower()
    if ext_hint and not ext_hint.startswith("."):
        ext_hint = "." + ext_hint
    ext = _image_extension(data, str(params.get("filename") or "") or (f"x{ext_hint}" if ext_hint else ""))
    if ext not in IMAGE_EXTENSIONS:
        raise RpcError(4016, f"unsupported image extension: {ext}")
    with state.cond:
        session.attachments += 1
        count = session.attachments
    target = state.home / "images" / f"upload_{session.runtime_id}_{count}{ext}"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    with state.cond:
        state.attachments.append(
            {"kind": "image", "session_id": session.runtime_id, "name": target.name, "bytes": len(data)}
        )
        state.changed()
    return {
        "attached": True,
        "path": str(target),
        "count": count,
        "remainder": "",
        "text": f"[User attached image: {target.name}]",
        "bytes": len(data),
        "name": target.name,
    }


def attach_file(state: FixtureState, session: LiveSession, params: dict[str, Any]) -> dict[str, Any]:
    raw_path = str(params.get("path") or "").strip()
    data_url = str(params.get("data_url") or "").strip()
    name = Path(str(params.get("name") or "").strip()).name
    if not raw_path and not data_url:
        raise RpcError(4015, "path or data_url required")
    if data_url:
        match = _DATA_URL.match(data_url)
        data = decode_base64(match.group(3)) if match is not None and match.group(2) else None
        if data is None:
            raise RpcError(5028, "data_url must be a base64 data URL")
        name = name or Path(raw_path).name or "upload.bin"
        stored = state.home / "attachments" / session.runtime_id / name
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_bytes(data)
        uploaded, size = True, len(data)
    else:
        stored = Path(raw_path).expanduser()
        if not stored.is_absolute() or not stored.is_file():
            raise RpcError(5028, f"file not found: {raw_path}")
        uploaded, size = False, stored.stat().st_size
    with state.cond:
        state.attachments.append({"kind": "file", "session_id": session.runtime_id, "name": stored.name, "bytes": size})
        state.changed()
    return {
        "attached": True,
        "name": stored.name,
        "path": str(stored),
        "ref_path": str(stored),
        "ref_text": f"@file:{stored}",
        "uploaded": uploaded,
    }
