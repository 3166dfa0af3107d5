"""The fixture's uvicorn protocol classes. HTTP requests are not access-logged and the WebSocket handshake line is
logged with its token redacted, so the fixture never writes the session token into a test's captured logs (tests
assert that Talaria does not). The WebSocket protocol also exposes its TCP transport to the app, so that a
"dropped" connection can be aborted without a close frame.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request as HandshakeRequest

from talaria.testing.hermes_fixture.ws import TRANSPORT_EXTENSION

_SECRET_QUERY = re.compile(r"\b(token|ticket)=[^&\s\"']*")


class _RedactCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _SECRET_QUERY.search(message):
            record.msg, record.args = _SECRET_QUERY.sub(r"\1=<redacted>", message), None
        return True


LOG = logging.getLogger("talaria.testing.hermes_fixture")
if not any(isinstance(f, _RedactCredentials) for f in LOG.filters):
    LOG.addFilter(_RedactCredentials())


class QuietHTTPProtocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = False
        self.logger = LOG


class ExposingWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = LOG

    def handle_connect(self, event: HandshakeRequest) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # set only for an accepted handshake
        extensions = scope.get("extensions") if scope is not None else None
        if extensions is not None:
            extensions[TRANSPORT_EXTENSION] = {"transport": self.transport}
