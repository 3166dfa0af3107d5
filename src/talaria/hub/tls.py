"""TLS without a proxy (operations.md 6): the checks ``talaria hub --tls-cert FILE --tls-key FILE`` makes before it
binds. uvicorn then loads the same files into a server context (Python's default: TLS 1.2 or newer, HTTP/1.1);
certificates are read at start, so replacing them is a drain and a restart."""

from __future__ import annotations

import os
import ssl
import stat

from talaria.errors import TalariaError


def _refused(message: str) -> TalariaError:
    return TalariaError("invalid_request", message)


def check_tls(cert: str, key: str) -> None:
    """One line naming the setting when the key file may be read by others, a file cannot be read, or the key does
    not match the certificate."""
    try:
        mode = os.stat(key).st_mode
    except OSError as exc:
        raise _refused(f"hub.tls_key {key}: cannot read the file ({exc.strerror})") from None
    if stat.S_IMODE(mode) & 0o077:
        raise _refused(f"hub.tls_key {key} may be read by group or other (mode {stat.S_IMODE(mode):04o}); "
                       f"run chmod 600 {key}")  # fmt: skip
    try:
        with open(cert, "rb"):
            pass
    except OSError as exc:
        raise _refused(f"hub.tls_cert {cert}: cannot read the file ({exc.strerror})") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = exc.reason or "not a PEM certificate and key"
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise _refused(f"hub.tls_key does not match hub.tls_cert ({reason})") from None
        raise _refused(f"hub.tls_cert {cert} and hub.tls_key {key} are not a PEM certificate chain and its key "
                       f"({reason})") from None  # fmt: skip
