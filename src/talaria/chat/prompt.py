"""A chat turn's prompt text (chat.md 5.4): the bot's instructions block, the carry-over block, the trigger text and
one line per file attachment, joined with ``\\n`` (the run marker follows on its own line, added by the driver).

The instructions block opens the first prompt of each new Hermes session (never a resumed one) and comes before
the carry-over notice. The carry-over block holds exactly one notice and the bounded transcript: earlier user
messages and complete final replies, oldest first, at most ``CARRY_MESSAGES`` of them and ``CARRY_CHARS``
characters, taken newest first until the next would break a bound; a message over ``CARRY_LONG`` characters is
carried as its first and last ``CARRY_HALF`` around a line saying how much was cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

NONE: Final = "none"
NODE_CHANGED: Final = "node-changed"
SESSION_REPLACED: Final = "session-replaced"
SESSION_RESTORED: Final = "session-restored"

NOTICES: Final = {
    NODE_CHANGED: "[talaria-notice:node-changed] This conversation continues on another execution node. Files, paths "
    "and state from before the move may be missing or different here: verify them before relying on them, and do "
    "not redo work the transcript shows as done.",
    SESSION_REPLACED: "[talaria-notice:session-replaced] The previous Hermes session of this conversation ended "
    "without a reply, so this turn starts a new one. The last user message below may not have been handled.",
    SESSION_RESTORED: "[talaria-notice:session-restored] The previous Hermes session of this conversation could not "
    "be resumed, so this turn starts a new one with the recent transcript below.",
}
CARRY_MESSAGES: Final = 50
CARRY_CHARS: Final = 30_000
CARRY_LONG: Final = 24_000
CARRY_HALF: Final = 12_000
NODE_SWITCH_MESSAGE: Final = (
    "This chat now runs on node {name}. The bot received the recent transcript; files from the previous node were "
    "not carried over."
)


@dataclass(frozen=True)
class Earlier:
    """One earlier message of the transcript: ``role`` ``user`` or ``assistant``, its text and attachments
    (``(name, node_path)``; a node path is None when it is not known)."""

    role: str
    text: str
    attachments: Sequence[tuple[str, str | None]] = ()


def bounded(text: str) -> str:
    if len(text) <= CARRY_LONG:
        return text
    cut = len(text) - 2 * CARRY_HALF
    return f"{text[:CARRY_HALF]}\n[… {cut} characters cut …]\n{text[-CARRY_HALF:]}"


def transcript(newest_first: Sequence[Earlier], *, node_changed: bool) -> list[str]:
    """The transcript's entries, oldest first, within the bounds; each entry its lines joined."""
    kept: list[str] = []
    used = 0
    for message in newest_first:
        if len(kept) == CARRY_MESSAGES:
            break
        text = bounded(message.text)
        if used + len(text) > CARRY_CHARS:
            break
        used += len(text)
        lines = [f"{'User' if message.role == 'user' else 'Assistant'}: {text}"]
        for name, path in message.attachments:
            if node_changed or path is None:
                lines.append(f'(attachment "{name}" was on the previous node and is not here)')
            else:
                lines.append(f'(attachment "{name}" was at {path} on this node; check that it is still there)')
        kept.append("\n".join(lines))
    kept.reverse()
    return kept


def carry_block(carry: str, newest_first: Sequence[Earlier]) -> str:
    entries = transcript(newest_first, node_changed=carry == NODE_CHANGED)
    return "\n".join([NOTICES[carry], "[talaria-transcript]", "\n\n".join(entries), "[/talaria-transcript]"])


def prompt_text(
    *,
    text: str,
    instructions: str,
    new_session: bool,
    carry: str,
    earlier: Sequence[Earlier] = (),
    file_refs: Sequence[str] = (),
) -> str:
    parts: list[str] = []
    if new_session and instructions:
        parts += ["[talaria-bot-instructions]", instructions, "[/talaria-bot-instructions]"]
    if carry != NONE:
        parts.append(carry_block(carry, earlier))
    parts.append(text)
    parts += list(file_refs)
    return "\n".join(parts)
