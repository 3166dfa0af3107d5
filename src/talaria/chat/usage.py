"""A turn's usage (chat.md 2): Hermes' ``message.complete`` carries its session's running totals (``input``,
``output``, ``total``, ``calls``, ``model``); a turn's usage is those totals minus the totals the conversation's
previous turn ended with, when this turn resumed that session. A new session's totals are its first turn's own, and
so are totals that went down (Hermes built a new agent for the resumed session).

What is stored is the public object plus ``session`` (the totals the next turn subtracts); what is shown is the
public object only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# public name -> Hermes' name (tui_gateway _get_usage)
COUNTS: Final = (("inputTokens", "input"), ("outputTokens", "output"), ("totalTokens", "total"), ("calls", "calls"))
SESSION: Final = "session"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def totals_of(payload: Mapping[str, Any]) -> dict[str, int] | None:
    """Hermes' session totals from a ``message.complete`` payload; None when it carries no usage object."""
    usage = payload.get("usage")
    if not isinstance(usage, Mapping):
        return None
    return {hermes: _count(usage.get(hermes)) for _, hermes in COUNTS}


def turn_usage(
    totals: Mapping[str, int], model: str, *, resumed: bool, before: Mapping[str, Any] | None
) -> dict[str, Any]:
    """This turn's usage, stored: ``resumed`` whether the turn ran in the session the previous turn ended in,
    ``before`` that turn's stored usage (or None)."""
    earlier = before.get(SESSION) if before is not None else None
    base: Mapping[str, Any] = {}
    if resumed and isinstance(earlier, Mapping):
        previous = {hermes: _count(earlier.get(hermes)) for _, hermes in COUNTS}
        if all(totals[hermes] >= previous[hermes] for _, hermes in COUNTS):
            base = previous
    own: dict[str, Any] = {"model": model or None}
    for public_name, hermes in COUNTS:
        own[public_name] = totals[hermes] - _count(base.get(hermes, 0))
    own[SESSION] = dict(totals)
    return own


def public(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the API shows of a stored usage: ``{model, inputTokens, outputTokens, totalTokens, calls}``."""
    if usage is None:
        return None
    return {key: usage.get(key) for key in ("model", *(name for name, _ in COUNTS))}
