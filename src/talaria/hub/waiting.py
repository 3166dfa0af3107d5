"""Why a queued job is not running yet (web-api.md 6 ``waitingReason``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from talaria.store.interface import Row

if TYPE_CHECKING:
    from talaria.hub.state import Hub


def waiting_reason(hub: Hub, job: Row) -> str | None:
    """Execution nodes arrive with the runner protocol; until then only Runtime API workers run jobs."""
    if job["state"] != "QUEUED":
        return None
    if hub.settings.runtime_api_enabled:
        return f"waiting for a Runtime API worker to claim it (no execution node serves cell {job['cell']})"
    return f"no execution node serves cell {job['cell']} and the Runtime API is off"
