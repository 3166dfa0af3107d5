"""What a web user may see: their own tasks and jobs, or, for an admin, every one of the tenant; the audit events
of their own bots, or, for an admin, of every bot of the tenant (the bots themselves are their owners' alone).

Anything else answers 404 ``not_found`` (never 403), so ids of others' objects leak nothing.
"""

from __future__ import annotations

from talaria.errors import TalariaError
from talaria.hub.api.websession import WebUser
from talaria.hub.resources import Hub
from talaria.lifecycle.reads import JobWithResult, TaskWithJob


def visible_task(hub: Hub, user: WebUser, task_id: str) -> TaskWithJob:
    """The task with its job id, if ``user`` may see it; else 404 ``not_found``."""
    found = hub.engine.task(user.account.tenant, task_id)
    if found is None or (not user.is_admin and found.task.created_by != user.account.principal):
        raise TalariaError("not_found", "no such task")
    return found


def visible_bot_events(hub: Hub, user: WebUser, bot_id: str) -> None:
    """Whether ``user`` may read the audit events of the bot: its owner, or an admin of its tenant; else 404."""
    owner = hub.bots.owner_of(user.account.tenant, bot_id)
    if owner is None or (not user.is_admin and owner != user.account.username):
        raise TalariaError("not_found", "no such bot")


def visible_conversation_events(hub: Hub, user: WebUser, conversation_id: str) -> None:
    """Whether ``user`` may read the audit events of the conversation: its owner, or an admin of its tenant."""
    owner = hub.conversations.owner_of(user.account.tenant, conversation_id)
    if owner is None or (not user.is_admin and owner != user.account.username):
        raise TalariaError("not_found", "no such conversation")


def visible_job(hub: Hub, user: WebUser, job_id: str) -> JobWithResult:
    """The job with its stored result, if ``user`` may see it; else 404 ``not_found``."""
    found = hub.engine.job(user.account.tenant, job_id)
    if found is None or (not user.is_admin and found[1].created_by != user.account.principal):
        raise TalariaError("not_found", "no such job")
    return found[0]
