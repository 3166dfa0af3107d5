"""The runner's numeric limits, each with what exceeding it produces (DESIGN.md principle 8).

Kept apart from ``talaria.limits`` so the runner package owns its own numbers; standard library only.
Section numbers refer to ``runner-protocol.md``.
"""

from __future__ import annotations

from typing import Final

# runner.json (sections 3 and 14) -> ConfigError, `talaria runner` exits with status 2
CONFIG_PROTOCOL: Final = 1
TOKEN_MIN_CHARS: Final = 32
TOKEN_MAX_CHARS: Final = 4096
# (the field limits of allowedProfiles and artifactRoots are the schema's: talaria.runner_json)
# Not in the protocol: a runner.json larger than this is refused before parsing (the largest valid
# file, 256 profiles of 256 characters and 64 long roots, is far below it) -> ConfigError, exit 2
MAX_CONFIG_FILE_BYTES: Final = 1024 * 1024

# Receipts (section 9)
# An error message stored and posted as a reply -> cut to this many characters
MAX_ERROR_MESSAGE_CHARS: Final = 1000
# `complete` receipts older than this (by `created`) -> state `retired`, `result` dropped
RECEIPT_RETAIN_MS: Final = 3600 * 1000
# Compaction runs at start-up, after this many handled commands, and on a timer (ADR 0019)
RECEIPT_COMPACT_EVERY: Final = 256
# The timer's period: a quiet runner compacts too -> `Compactor` runs `Receipts.compact` this often
RECEIPT_COMPACT_INTERVAL_S: Final = 60
# `retired` receipts older than this (by `created`) -> deleted; a command is never redelivered this late
# (deadline 30 s, 70 s for grant.bind), and a late one fails admission on its `expiresAt`
RECEIPT_DELETE_AFTER_MS: Final = 24 * 3600 * 1000
# Session records (section 11.2) not renewed by an open, resume or bind for this long -> deleted; the
# history of such a session is then `runner_session_forbidden` until it is resumed again
SESSION_RECORD_RETAIN_MS: Final = 24 * 3600 * 1000
# Receipt writes run on the event loop while they are fast; one slower than this moves them to a
# worker thread (a slow disk must not stall the poll loop) -> `ReceiptWrites` goes off-loop
RECEIPT_INLINE_MAX_S: Final = 0.002
# Off the loop, this many consecutive fast writes bring them back onto it
RECEIPT_INLINE_RETURN_AFTER: Final = 64
