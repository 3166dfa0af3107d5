"""The rules for people's text fields (web-api.md 9, issue 12 item 3), shared by every door that takes them.

A **one-line** field (a title, a name, a reason) is trimmed, must not be blank, and refuses every C0 and C1
control character and the Unicode bidirectional controls (U+202A-202E, U+2066-2069, which can make
``\u202etxt.exe`` read as ``exe.txt``). A **multi-line** field (a prompt) must not be blank and allows, of the
controls, only ``\\n`` and ``\\t``; it is kept as written. Standard library only (the runner stays light).
"""

from __future__ import annotations

from typing import Final

BIDI_CONTROLS: Final = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))
MULTI_LINE_CONTROLS: Final = frozenset("\n\t")
# The same rules as JSON-schema patterns, for the OpenAPI document (ADR 0029): what matches is always accepted
# (the server trims a one-line field first, so it also accepts controls at either end).
_REFUSED = r"\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069"
_REFUSED_MULTI = r"\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069"
ONE_LINE_PATTERN: Final = rf"^[^{_REFUSED}]*[^\s{_REFUSED}][^{_REFUSED}]*$"
MULTI_LINE_PATTERN: Final = rf"^[^{_REFUSED_MULTI}]*[^\s{_REFUSED_MULTI}][^{_REFUSED_MULTI}]*$"


class TextRefused(ValueError):
    """A text field broke a rule; ``str()`` names the field and the rule, never the value."""


def is_control(ch: str) -> bool:
    """A C0 or C1 control character (U+0000-001F, U+007F-009F)."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _check(field: str, value: str, allowed: frozenset[str]) -> None:
    if not value.strip():
        raise TextRefused(f"{field} must not be blank")
    for ch in value:
        if (is_control(ch) and ch not in allowed) or ch in BIDI_CONTROLS:
            kind = "a bidirectional control" if ch in BIDI_CONTROLS else "a control character"
            raise TextRefused(f"{field} must not contain {kind} (U+{ord(ch):04X})")


def one_line(field: str, value: str) -> str:
    """``value`` trimmed; raises ``TextRefused`` if blank or holding (inside) a control or bidi character."""
    trimmed = value.strip()
    _check(field, trimmed, frozenset())
    return trimmed


def multi_line(field: str, value: str) -> str:
    """``value`` as written; raises ``TextRefused`` if blank or holding a control other than ``\\n``/``\\t``."""
    _check(field, value, MULTI_LINE_CONTROLS)
    return value
