"""Shared FastAPI dependencies: the hub, the signed-in user, request bodies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict

from talaria.hub.api.websession import WebUser, web_user
from talaria.hub.resources import Hub


def get_hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


class StrictBody(BaseModel):
    """Request bodies: unknown fields and type coercion are refused (400 ``invalid_request``)."""

    model_config = ConfigDict(extra="forbid", strict=True)


HubDep = Annotated[Hub, Depends(get_hub)]
UserDep = Annotated[WebUser, Depends(web_user())]
AdminDep = Annotated[WebUser, Depends(web_user(admin=True))]
