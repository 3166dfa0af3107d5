"""Shared FastAPI dependencies: the hub, the signed-in user, request bodies and their text fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict

from talaria.errors import TalariaError
from talaria.hub.api.websession import WebUser, web_user
from talaria.hub.resources import Hub
from talaria.text_rules import TextRefused


def get_hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


class StrictBody(BaseModel):
    """Request bodies: unknown fields and type coercion are refused (400 ``invalid_request``)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def text_field(rule: Callable[[str, str], str], field: str, value: str) -> str:
    """``value`` by a ``talaria.text_rules`` rule; a refusal is 400 ``invalid_request`` naming the field."""
    try:
        return rule(field, value)
    except TextRefused as exc:
        raise TalariaError("invalid_request", str(exc)) from None


HubDep = Annotated[Hub, Depends(get_hub)]
UserDep = Annotated[WebUser, Depends(web_user())]
AdminDep = Annotated[WebUser, Depends(web_user(admin=True))]
