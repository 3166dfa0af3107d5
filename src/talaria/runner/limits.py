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
MAX_ALLOWED_PROFILES: Final = 256  # counted after duplicates are removed
MAX_PROFILE_CHARS: Final = 256
MAX_ARTIFACT_ROOTS: Final = 64
# Not in the protocol: a runner.json larger than this is refused before parsing (the largest valid
# file, 256 profiles of 256 characters and 64 long roots, is far below it) -> ConfigError, exit 2
MAX_CONFIG_FILE_BYTES: Final = 1024 * 1024

# Receipts (section 9)
# An error message stored and posted as a reply -> cut to this many characters
MAX_ERROR_MESSAGE_CHARS: Final = 1000
# `complete` receipts older than this (by `created`) -> state `retired`, `result` dropped
RECEIPT_RETAIN_MS: Final = 3600 * 1000
# Compaction runs at start-up and after this many handled commands
RECEIPT_COMPACT_EVERY: Final = 256
# Receipt writes run on the event loop while they are fast; one slower than this moves them to a
# worker thread (a slow disk must not stall the poll loop) -> `ReceiptWrites` goes off-loop
RECEIPT_INLINE_MAX_S: Final = 0.002
# Off the loop, this many consecutive fast writes bring them back onto it
RECEIPT_INLINE_RETURN_AFTER: Final = 64
