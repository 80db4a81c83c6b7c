"""Authentication (who is calling) and the access table (who may call what).

The contract is API.md's "Authentication and roles".

With ``CORRAL_AUTH_TOKENS`` set, every request but the open ones carries a token, in an
``Authorization: Bearer TOKEN`` header or (the dashboard) a ``corral_token`` cookie, which only the
dashboard's pages and the API's reads accept (``cookie_accepted``). The token file
holds ``TOKEN ROLE NAME`` lines; it is re-read when it changes (checked at most once a second), so
a revoked token stops working within a second or two, with no restart.

Invariants:

1. Every route of the app has exactly one entry in ``ACCESS``: ``check_every_route_has_a_rule`` stops
   ``create_app`` on a route without one, and ``tests/api/test_access_table.py`` calls every route
   with every role. A new route cannot ship without someone deciding who may call it.
2. Tokens are compared in constant time (``hmac.compare_digest`` over every entry, no early exit)
   and never logged, echoed or put in an error message: a bad line of the token file is reported by
   its line number only.
3. The decision is made here, before the route runs, from the rule, the caller and the request's
   path and query; the one thing a rule cannot see before the route reads it, a worker id in a
   register body, the route checks with ``require_worker_id``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.domain import errors
from corral.server.http import error_response

logger = logging.getLogger("corral.server.auth")

#: how often, at most, the token file's identity (mtime, size, inode) is looked at
RECHECK_S = 1.0
#: what a caller who may not see a job's environment values sees instead of each value
HIDDEN = "<hidden>"
COOKIE = "corral_token"
#: where the middleware puts a request's ``still_authorized`` check in the ASGI scope
STILL_AUTHORIZED = "corral.still_authorized"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ANY_WORKER = "*"


class Role(enum.StrEnum):
    ADMIN = "admin"
    USER = "user"
    WORKER = "worker"


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a token stands for. ``name`` is a user's name or (role worker) the worker id it
    may act as, ``*`` for any."""

    role: Role
    name: str

    def may_act_as_worker(self, worker_id: str) -> bool:
        if self.role == Role.ADMIN:
            return True
        return self.role == Role.WORKER and self.name in (ANY_WORKER, worker_id)


# --- the access table --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may call a route. ``roles`` None: open to anyone, no token needed. Admins may call
    every route that is not open. ``owner``: a user must own the job (``job_id`` path parameter),
    gang (``gang_id``) or array (``array_id``) it names. ``worker_id_in``: a worker must be the one
    named by the ``path`` parameter, the ``query`` parameter or (checked by the route) the ``body``."""

    name: str
    roles: frozenset[Role] | None
    owner: str | None = None
    worker_id_in: str | None = None


OPEN = Rule("open", None)
READ = Rule("read", frozenset({Role.ADMIN, Role.USER}))
SUBMIT = Rule("submit", frozenset({Role.ADMIN, Role.USER}))
OWN_JOB = Rule("own job", frozenset({Role.ADMIN, Role.USER}), owner="job_id")
OWN_GANG = Rule("own gang", frozenset({Role.ADMIN, Role.USER}), owner="gang_id")
OWN_ARRAY = Rule("own array", frozenset({Role.ADMIN, Role.USER}), owner="array_id")
ADMIN = Rule("admin", frozenset({Role.ADMIN}))
WORKER_PATH = Rule("worker (path id)", frozenset({Role.ADMIN, Role.WORKER}), worker_id_in="path")
WORKER_QUERY = Rule("worker (query id)", frozenset({Role.ADMIN, Role.WORKER}), worker_id_in="query")
WORKER_BODY = Rule("worker (body id)", frozenset({Role.ADMIN, Role.WORKER}), worker_id_in="body")
#: a job's stored checkpoint: its owner, admins, and any worker (a gang rank loads its peers')
CHECKPOINT_READ = Rule("checkpoint read", frozenset({Role.ADMIN, Role.USER, Role.WORKER}), owner="job_id")

#: (method, route path) -> rule. One entry per route; a Mount's entry is ("GET", its path).
ACCESS: dict[tuple[str, str], Rule] = {
    # operations
    ("GET", "/health"): OPEN,
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/metrics"): OPEN,
    ("GET", "/openapi.json"): Rule("any role", frozenset({Role.ADMIN, Role.USER, Role.WORKER})),
    # the dashboard: pages read like GET /jobs; its cancels are the API's cancels; its static
    # files (CSS, script) are open so the page can ask for a token
    ("GET", "/"): READ,
    ("GET", "/ui/jobs"): READ,
    ("GET", "/ui/jobs/{job_id}"): READ,
    ("POST", "/ui/jobs/{job_id}/cancel"): OWN_JOB,
    ("GET", "/ui/gangs/{gang_id}"): READ,
    ("POST", "/ui/gangs/{gang_id}/cancel"): OWN_GANG,
    ("GET", "/ui/workers"): READ,
    ("GET", "/ui/pools"): READ,
    ("GET", "/ui/static/{name}"): OPEN,
    # job logs: read like a job; appended by the worker running the attempt (fenced like a report)
    ("GET", "/jobs/{job_id}/logs"): READ,
    ("POST", "/jobs/{job_id}/logs"): WORKER_QUERY,
    # users: jobs and gangs
    ("POST", "/jobs"): SUBMIT,
    ("POST", "/jobs/batch"): SUBMIT,
    ("GET", "/jobs/batch"): READ,
    ("GET", "/jobs"): READ,
    ("GET", "/jobs/{job_id}"): READ,
    ("GET", "/jobs/{job_id}/events"): READ,
    ("GET", "/jobs/{job_id}/why"): READ,
    ("POST", "/jobs/{job_id}/cancel"): OWN_JOB,
    ("GET", "/gangs/{gang_id}"): READ,
    ("GET", "/gangs/{gang_id}/events"): READ,
    ("GET", "/gangs/{gang_id}/why"): READ,
    ("POST", "/gangs/{gang_id}/cancel"): OWN_GANG,
    ("GET", "/arrays/{array_id}"): READ,
    ("GET", "/arrays/{array_id}/events"): READ,
    ("GET", "/arrays/{array_id}/why"): READ,
    ("POST", "/arrays/{array_id}/cancel"): OWN_ARRAY,
    # workers
    ("POST", "/workers/register"): WORKER_BODY,
    ("GET", "/workers"): READ,
    ("GET", "/workers/{worker_id}"): Rule(
        "read or self", frozenset({Role.ADMIN, Role.USER, Role.WORKER}), worker_id_in="path"
    ),
    ("POST", "/workers/{worker_id}/heartbeat"): WORKER_PATH,
    ("POST", "/workers/{worker_id}/drain"): ADMIN,
    ("POST", "/workers/{worker_id}/undrain"): ADMIN,
    ("DELETE", "/workers/{worker_id}"): ADMIN,
    ("POST", "/workers/{worker_id}/leave"): WORKER_PATH,
    ("POST", "/workers/{worker_id}/reports"): WORKER_PATH,
    # the job protocol: every call names its worker in the query (and is fenced by the store)
    ("GET", "/jobs/next"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/heartbeat"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/done"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/fail"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/preempted"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/watchdog"): WORKER_QUERY,
    ("POST", "/jobs/{job_id}/checkpoint"): WORKER_QUERY,
    ("GET", "/jobs/{job_id}/checkpoint"): CHECKPOINT_READ,
    # pools
    ("GET", "/pools"): READ,
    ("GET", "/pools/{path:path}"): READ,
    ("PUT", "/pools/{path:path}"): ADMIN,
    ("DELETE", "/pools/{path:path}"): ADMIN,
    # usage: a user's own rows (the route narrows them), an admin's all
    ("GET", "/usage"): READ,
}


def route_keys(routes: Sequence[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every route: what ``ACCESS`` must hold an entry for."""
    keys: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Route):
            keys.extend((method, route.path) for method in sorted(route.methods or ()) if method != "HEAD")
        elif isinstance(route, Mount):
            keys.append(("GET", route.path))
        else:
            keys.append(("?", repr(route)))
    return keys


def check_every_route_has_a_rule(routes: Sequence[BaseRoute]) -> None:
    missing = [key for key in route_keys(routes) if key not in ACCESS]
    if missing:
        listed = ", ".join(f"{method} {path}" for method, path in missing)
        raise RuntimeError(
            f"routes without an access rule in corral.server.auth.ACCESS: {listed} "
            "(decide who may call each one)"
        )


# --- the token file ----------------------------------------------------------------------------


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="surrogateescape")).digest()


def parse_token_file(text: str, source: str = "token file") -> list[tuple[bytes, Principal]]:
    """``TOKEN ROLE NAME`` lines (``#`` starts a comment) as (token digest, principal). A bad
    line is skipped with a warning that names its number, never its content (it holds a token)."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 3 or fields[1] not in Role.__members__.values():
            logger.warning(
                "token file line skipped: expected TOKEN ROLE NAME with role admin, user or worker",
                extra={"source": source, "line": number},
            )
            continue
        token, role, name = fields
        entries.append((_digest(token), Principal(Role(role), name)))
    return entries


class TokenFile:
    """The tokens of ``path``, re-read when the file changes.

    A file that cannot be read after start denies everyone (fail closed) until it can be again;
    one that cannot be read at start is an error (``load`` raises ``OSError``).
    """

    def __init__(self, path: str | Path, recheck_s: float = RECHECK_S) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._entries: list[tuple[bytes, Principal]] = []
        self._identity: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        #: bumped whenever the entries change (read again, or emptied): a stream that outlives its
        #: request checks its token again when this moves (``revision``)
        self._revision = 0
        self.load()

    def load(self) -> None:
        stat = os.stat(self.path)
        if stat.st_mode & 0o077:
            logger.warning(
                "token file is readable by other users of this host: chmod 600 it",
                extra={"source": str(self.path), "mode": oct(stat.st_mode & 0o777)},
            )
        text = self.path.read_text(encoding="utf-8", errors="surrogateescape")
        self._entries = parse_token_file(text, str(self.path))
        self._identity = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        self._checked_at = time.monotonic()
        self._revision += 1

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < self.recheck_s:
            return
        self._checked_at = now
        try:
            stat = os.stat(self.path)
            if (stat.st_mtime_ns, stat.st_size, stat.st_ino) == self._identity:
                return
            self.load()
            logger.info("token file re-read", extra={"source": str(self.path), "tokens": len(self._entries)})
        except OSError as error:
            if self._entries or self._identity is not None:
                logger.error(
                    "token file unreadable: every token refused until it is back",
                    extra={"source": str(self.path), "error": type(error).__name__},
                )
            if self._identity is not None:
                self._revision += 1
            self._entries = []
            self._identity = None

    def revision(self) -> int:
        """A number that changes whenever the tokens may have (the file looked at, at most once
        every ``recheck_s``)."""
        self.refresh()
        return self._revision

    def principal(self, token: str) -> Principal | None:
        """The principal of ``token``: compared with every entry in constant time, no early exit."""
        self.refresh()
        presented = _digest(token)
        found = None
        for digest, principal in self._entries:
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


def presented_token(scope: Scope) -> tuple[str | None, bool]:
    """The token of a request, and whether it came from the cookie: ``Authorization: Bearer``
    first, else the ``corral_token`` cookie."""
    cookie = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return str(token.strip()), False
        elif name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, cookie_value = part.strip().partition("=")
                if key == COOKIE and cookie_value:
                    cookie = unquote(str(cookie_value))
    return cookie, cookie is not None


def dashboard_path(path: str) -> bool:
    return path == "/" or path.startswith("/ui/")


def cookie_accepted(rule: Rule, scope: Scope) -> bool:
    """Whether the ``corral_token`` cookie may stand for the caller of this request: on the
    dashboard's routes, and on the reads its pages make of the API (a job's logs, its checkpoint
    download); never on a change made through the API, nor on a route that acts for a worker (the
    job protocol, a worker's register and heartbeat). A browser sends the cookie with every
    request to this site, whoever made the page that asks: those routes take a bearer token only."""
    if dashboard_path(scope["path"]):
        return True
    return scope["method"] in SAFE_METHODS and rule.worker_id_in is None


def cross_site(scope: Scope) -> bool:
    """Whether a browser says the request comes from another site (``Origin`` naming a host other
    than ``Host``): a cookie rides along with such a request, so it cannot stand for the caller."""
    origin: str | None = None
    host: str | None = None
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            origin = str(value.decode("latin-1"))
        elif name == b"host":
            host = str(value.decode("latin-1"))
    if origin is None or origin == "null":
        return origin == "null"
    return origin.partition("://")[2].rstrip("/") != (host or "")


# --- the middleware ----------------------------------------------------------------------------

#: what a browser gets for a dashboard page without a valid token: the dashboard's sign-in page,
#: whose form's script (``dashboard/static/login.js``: no inline script, the pages' policy forbids it)
#: keeps the token in the ``corral_token`` cookie (this site only; ``Secure`` when the page came over
#: HTTPS: the browser never sends the token over plain HTTP, even to a link that drops the ``s``) and
#: loads the page again with it. The cookie's scope, the routes that accept it and this page live
#: here together, so the rules a browser's token follows are read in one place.
_SIGN_IN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · corral</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/corral.css"></head>
<body>
<header><nav aria-label="Main"><a class="brand" href="/">corral</a></nav></header>
<main id="content" class="sign-in">
<h1>Sign in</h1>
<p>This server needs a token (ask its admin). The dashboard acts with that token's role.</p>
{rejected}<form id="token-form" class="token-form">
  <label for="token">Token</label>
  <input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
  <button type="submit">Sign in</button>
</form>
<p class="muted">The token is kept in a cookie of this site, which the dashboard's pages and the
API's reads accept (a change through the API takes <code>Authorization: Bearer TOKEN</code> only).</p>
<script src="/ui/static/login.js"></script>
</main>
</body></html>
"""
_REJECTED = '<p class="error" role="alert">That token was not accepted: it is unknown or revoked.</p>\n'


def sign_in_page(rejected: bool) -> str:
    """The sign-in page; ``rejected``: the browser's cookie held a token that stands for no one
    (mistyped, or revoked since), which the page says rather than asking again in silence."""
    return _SIGN_IN_PAGE.format(rejected=_REJECTED if rejected else "")


def wants_page(scope: Scope) -> bool:
    """A dashboard page asked for (``/``, ``/ui/...``, read with GET): it answers the sign-in page,
    never a JSON 401, unless the caller asks for JSON alone (``Accept: application/json`` without
    ``text/html``: a script, which gets the API's error)."""
    if scope["method"] != "GET" or not dashboard_path(scope["path"]):
        return False
    for name, value in scope.get("headers", ()):
        if name == b"accept":
            return b"text/html" in value or b"application/json" not in value
    return True


def still_authorized(request: Request) -> Callable[[], bool]:
    """For a stream that outlives its request (a log follow): a check that the token it was
    authorized with still stands for the same caller; always true when authentication is off."""
    check: Callable[[], bool] | None = request.scope.get(STILL_AUTHORIZED)
    return check or _always


def _always() -> bool:
    return True


def principal_of(request: Request) -> Principal | None:
    """The caller of a request; None when authentication is off."""
    principal: Principal | None = request.scope.get("corral.principal")
    return principal


def require_worker_id(request: Request, worker_id: str) -> None:
    """The body-carried worker id of a ``worker_id_in="body"`` route: 403 unless the caller may act as it."""
    principal = principal_of(request)
    if principal is not None and not principal.may_act_as_worker(worker_id):
        raise errors.Forbidden(f"this token may not act as worker {worker_id}")


def may_see_env(principal: Principal | None, owner: str | None) -> bool:
    """Who sees a job's environment values: everyone when auth is off; else admins and its owner."""
    return principal is None or principal.role == Role.ADMIN or principal.name == owner


def redact_job(wire: dict[str, Any], principal: Principal | None) -> dict[str, Any]:
    """A job's wire object as ``principal`` may see it: the keys of its ``env``, not the values."""
    if may_see_env(principal, wire.get("user")) or not wire.get("env"):
        return wire
    return {**wire, "env": dict.fromkeys(wire["env"], HIDDEN)}


#: ``(kind, id)`` -> whether the job (``kind`` "job") or gang exists, and its owner (``user``):
#: store work, awaited (the server runs it through its executor)
OwnerLookup = Callable[[str, str], Awaitable[tuple[bool, str | None]]]


class AuthMiddleware:
    """Authenticates each request and applies its route's rule before the route runs.

    ``owner_of(kind, id)`` says whether a job or gang exists and who owns it (one that does not
    exist is left to the route, which answers 404 as it would for anyone).
    """

    def __init__(
        self, app: ASGIApp, tokens: TokenFile, routes: Sequence[BaseRoute], owner_of: OwnerLookup
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.routes = routes
        self.owner_of = owner_of

    def _match(self, scope: Scope) -> tuple[tuple[str, str] | None, dict[str, Any]]:
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                method = "GET" if isinstance(route, Mount) else scope["method"]
                if method == "HEAD":
                    method = "GET"
                path = route.path if isinstance(route, (Route, Mount)) else ""
                return (method, path), child.get("path_params", {})
        return None, {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key, params = self._match(scope)
        # No full match: the router answers 404 or 405, which tells nothing a route would not.
        rule = ACCESS.get(key, ADMIN) if key is not None else OPEN
        if rule.roles is None:
            await self.app(scope, receive, send)
            return
        token, from_cookie = presented_token(scope)
        if from_cookie and not cookie_accepted(rule, scope):
            await error_response(
                401,
                "unauthenticated",
                "the dashboard's cookie is accepted by its pages and the API's reads only:"
                " this route needs Authorization: Bearer TOKEN",
                headers={"WWW-Authenticate": "Bearer"},
            )(scope, receive, send)
            return
        principal = self.tokens.principal(token) if token else None
        if (
            principal is not None
            and from_cookie
            and scope["method"] not in SAFE_METHODS
            and cross_site(scope)
        ):
            # A form on another site can make a browser send the cookie (cross-site request forgery).
            await error_response(403, "forbidden", "a cookie-authenticated change must come from this site")(
                scope, receive, send
            )
            return
        if principal is None and wants_page(scope):
            await HTMLResponse(sign_in_page(rejected=token is not None and from_cookie), status_code=401)(
                scope, receive, send
            )
            return
        if principal is None:
            response = error_response(
                401,
                "unauthenticated",
                "a valid token is required (Authorization: Bearer TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        refusal = await self._refusal(rule, principal, scope, params)
        if refusal is not None:
            await error_response(403, "forbidden", refusal)(scope, receive, send)
            return
        scope["corral.principal"] = principal
        assert token is not None  # a principal came from it
        scope[STILL_AUTHORIZED] = partial(self._still_authorized, token, principal)
        await self.app(scope, receive, send)

    def _still_authorized(self, token: str, principal: Principal) -> bool:
        """Whether ``token`` still stands for ``principal`` (not revoked, role not changed)."""
        return self.tokens.principal(token) == principal

    async def _refusal(
        self, rule: Rule, principal: Principal, scope: Scope, params: dict[str, Any]
    ) -> str | None:
        """Why ``principal`` may not call this route, or None when it may."""
        assert rule.roles is not None
        if principal.role not in rule.roles:
            return f"role {principal.role} may not call this route"
        if principal.role == Role.ADMIN:
            return None
        if principal.role == Role.WORKER and rule.worker_id_in in ("path", "query"):
            if rule.worker_id_in == "path":
                worker_id = params.get("worker_id", "")
            else:
                worker_id = Request(scope).query_params.get("worker_id", "")
            if not principal.may_act_as_worker(worker_id):
                return f"this token may not act as worker {worker_id or '(none given)'}"
            return None
        if principal.role == Role.USER and rule.owner is not None:
            kind = rule.owner.removesuffix("_id")
            exists, owner = await self.owner_of(kind, str(params.get(rule.owner, "")))
            if exists and owner != principal.name:
                return f"only the owner of this {kind} (or an admin) may do this"
        return None
