"""Why a queued job is not running yet (web-api.md 6 ``waitingReason``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from talaria.lifecycle.records import Job

if TYPE_CHECKING:
    from talaria.hub.resources import Hub


def waiting_reason(hub: Hub, job: Job) -> str | None:
    """A sentence for people: which execution node would run the job and what it is waiting for."""
    if job.state != "QUEUED":
        return None
    cell, profile = job.cell, job.profile
    record = hub.registry.for_source(job.tenant, cell)
    workers = " or a Runtime API worker" if hub.settings.runtime_api_enabled else ""
    if record is None:
        if hub.settings.runtime_api_enabled:
            return f"waiting for a Runtime API worker (no execution node serves cell {cell})"
        return f"no execution node serves cell {cell} and the Runtime API is off"
    if profile not in record.allowed_profiles:
        return f"execution node {record.name!r} for cell {cell} does not allow profile {profile}"
    if not hub.runners.is_connected(record.id):
        return f"waiting for execution node {record.name!r} (cell {cell}) to connect{workers}"
    if not hub.runners.accepts_work(record.id):
        return f"node {record.name} is draining"
    if not hub.settings.dispatcher_enabled:
        return f"the hub's dispatcher is off; waiting for a Runtime API worker (cell {cell})"
    if hub.dispatcher.holds.is_held(record.id):
        return f"Hermes on execution node {record.name!r} is unavailable; the job runs when it answers again"
    if hub.dispatcher.is_full(record.id):
        return f"execution node {record.name!r} is busy; the job runs when a slot frees"
    return f"about to run on execution node {record.name!r}"
