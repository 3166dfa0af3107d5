"""The error a command answers with: ``{error: {message, code}}`` (runner-protocol.md 7)."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 1000


class CommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:MAX_MESSAGE_CHARS]

    def reply(self) -> dict[str, dict[str, str]]:
        return {"error": {"message": self.message, "code": self.code}}
