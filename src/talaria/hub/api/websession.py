"""Web sessions, CSRF and Origin checks (web-api.md 2).

The cookie ``talaria_session`` carries only a random session id, signed with the hub's key from
``<data_dir>/secret.key``; the store keeps the id's SHA-256 with the CSRF token. Checks run in
order: session (401 ``unauthenticated``), CSRF and Origin on state-changing methods (403
``csrf_failed``), admin routes (403 ``admin_required``).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute
from itsdangerous import BadSignature, Signer
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from talaria.accounts.service import Account
from talaria.canonical import sha256_hex
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.lifecycle.actor import PLATFORM_ADMIN, Actor
from talaria.limits import SESSION_IDLE_S, SESSION_MAX_S
from talaria.store.hub_keys import hub_key
from talaria.store.interface import Store

COOKIE = "talaria_session"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_TOUCH_EVERY_MS = 60_000


def load_secret_key(store: Store, data_dir: Path, now_ms: int) -> bytes:
    """The web-session key ``secret.key``, made (32 random bytes) at first start: a file of the data directory (mode
    600), or on PostgreSQL the replicas' shared row."""
    return hub_key(store, data_dir, "secret.key", now_ms)


@dataclass(frozen=True)
class WebUser:
    account: Account
    csrf_token: str
    session_hash: str

    @property
    def is_admin(self) -> bool:
        return self.account.role == "admin"

    @property
    def actor(self) -> Actor:
        roles = frozenset({PLATFORM_ADMIN}) if self.is_admin else frozenset()
        return Actor(self.account.principal, roles, "web", self.account.tenant)


class WebSessions:
    def __init__(self, store: Store, clock: Clock, secret_key: bytes, *, public_origin: str) -> None:
        self.store = store
        self.clock = clock
        self.signer = Signer(secret_key, salt="talaria-session")
        self.public_origin = public_origin
        self.secure = public_origin.startswith("https://")

    def create(self, account: Account) -> tuple[str, str]:
        """A new session for ``account``: (cookie value, CSRF token). Only while the account is enabled and still at
        ``account.auth_version``: a password, role or enablement change committed since it was read (which ended
        the account's sessions) refuses it with 401 ``invalid_credentials``."""
        session_id = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        with self.store.write() as tx:
            made = tx.run(
                "session_insert",
                id_hash=sha256_hex(session_id),
                username=account.username,
                csrf_token=csrf,
                auth_version=account.auth_version,
                now=self.clock.now_ms(),
            )
        if made != 1:
            raise TalariaError("invalid_credentials", "the account changed while signing in; sign in again")
        return self.signer.sign(session_id.encode()).decode(), csrf

    def _session_hash(self, cookie: str | None) -> str | None:
        if not cookie:
            return None
        try:
            return sha256_hex(self.signer.unsign(cookie.encode()).decode())
        except (BadSignature, UnicodeDecodeError):
            return None

    def lookup(self, cookie: str | None) -> WebUser | None:
        """The live session of this cookie, or None (bad signature, ended, expired, account disabled)."""
        id_hash = self._session_hash(cookie)
        if id_hash is None:
            return None
        now = self.clock.now_ms()
        with self.store.read() as tx:
            row = tx.one("session_get", id_hash=id_hash)
            account_row = tx.one("account_get", username=row["username"]) if row else None
        if row is None or account_row is None or not row["enabled"]:
            return None
        if now - row["last_seen_at"] >= SESSION_IDLE_S * 1000 or now - row["created_at"] >= SESSION_MAX_S * 1000:
            self.end_hash(id_hash)
            return None
        if now - row["last_seen_at"] >= _TOUCH_EVERY_MS:
            with self.store.write() as tx:
                tx.run("session_touch", id_hash=id_hash, now=now)
        return WebUser(Account.from_row(account_row), row["csrf_token"], id_hash)

    def still_valid(self, user: WebUser) -> bool:
        """Whether ``user``'s session still holds, for a request held open (a chat event stream): not ended,
        not expired, its account enabled and its ``auth_version`` unchanged since ``user`` was looked up. Reads
        only: holding a stream open is not activity, so it neither touches nor ends the session."""
        now = self.clock.now_ms()
        with self.store.read() as tx:
            row = tx.one("session_get", id_hash=user.session_hash)
        if row is None or not row["enabled"] or int(row["auth_version"]) != user.account.auth_version:
            return False
        idle, age = now - int(row["last_seen_at"]), now - int(row["created_at"])
        return idle < SESSION_IDLE_S * 1000 and age < SESSION_MAX_S * 1000

    def end(self, cookie: str | None) -> None:
        id_hash = self._session_hash(cookie)
        if id_hash is not None:
            self.end_hash(id_hash)

    def end_hash(self, id_hash: str) -> None:
        with self.store.write() as tx:
            tx.run("session_delete", id_hash=id_hash)

    def prune(self) -> int:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            return tx.run(
                "session_prune",
                idle_before=now - SESSION_IDLE_S * 1000,
                created_before=now - SESSION_MAX_S * 1000,
            )

    def origin_ok(self, request: Request) -> bool:
        return request.headers.get("origin") == self.public_origin

    async def csrf_ok(self, request: Request, user: WebUser) -> bool:
        presented = request.headers.get("x-csrf-token")
        if presented is None:
            content_type = request.headers.get("content-type", "")
            if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
                form = await request.form()
                field = form.get("csrf_token")
                presented = field if isinstance(field, str) else None
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), user.csrf_token.encode()) and self.origin_ok(request)


async def authenticate(request: Request, *, admin: bool) -> WebUser:
    """Session (401), then CSRF and Origin on state-changing methods (403), then admin (403)."""
    sessions: WebSessions = request.app.state.hub.sessions
    user = await run_in_threadpool(sessions.lookup, request.cookies.get(COOKIE))
    if user is None:
        raise TalariaError("unauthenticated", "sign in first")
    if request.method in STATE_CHANGING and not await sessions.csrf_ok(request, user):
        raise TalariaError("csrf_failed", "missing or wrong CSRF token or Origin")
    if admin and not user.is_admin:
        raise TalariaError("admin_required", "this needs an admin account")
    return user


class WebUserDependency:
    """The signed-in user as a FastAPI dependency; ``WebRoute`` runs the checks before the body."""

    def __init__(self, *, admin: bool) -> None:
        self.admin = admin

    async def __call__(self, request: Request) -> WebUser:
        checked: WebUser | None = getattr(request.state, "web_user", None)
        if checked is not None:
            return checked
        return await authenticate(request, admin=self.admin)


def web_user(*, admin: bool = False) -> WebUserDependency:
    return WebUserDependency(admin=admin)


class WebRoute(APIRoute):
    """A route whose session, CSRF and admin checks run before FastAPI reads and validates the body,
    so an anonymous request gets 401 whatever it sends (web-api.md 2)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        wanted = [d.call for d in self.dependant.dependencies if isinstance(d.call, WebUserDependency)]
        if not wanted:
            return handler
        admin = any(dep.admin for dep in wanted)

        async def checked(request: Request) -> Response:
            request.state.web_user = await authenticate(request, admin=admin)
            return await handler(request)

        return checked
