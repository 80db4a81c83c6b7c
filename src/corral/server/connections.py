"""Connections: how long one may sit without a request, and how many may be open.

A probe held the server's sockets with connections that sent nothing, or sent their headers a
byte at a time: none timed out, and about 1,000 of them (a systemd unit's default of 1,024 open
files) made every request fail and killed the planner's child process (its pipes could not be
opened). Four rules, applied where uvicorn accepts and parses a connection
(``GuardedHttpProtocol``, uvicorn's own ``httptools`` protocol with these added):

1. **Header timeout** (``CORRAL_HEADER_TIMEOUT_S``, 10 s): a new connection's first request, and a
   kept-alive connection's next one from its first byte, must have sent every header within it.
   Past it the connection is closed: answered 408 ``request_timeout`` when part of a request came,
   closed without an answer when nothing did (a slow-header client cannot hold a socket).
2. **Idle timeout** (``CORRAL_IDLE_TIMEOUT_S``, 30 s): a kept-alive connection with no request in
   progress is closed (uvicorn's keep-alive timeout). A request in progress, a follow stream or a
   claim's long poll included, is not idle.
3. **Connections per client** (``CORRAL_MAX_CONNECTIONS_PER_CLIENT``, 256): a client is its remote
   address, and, once a request on the connection has authenticated, the token's principal from
   that address (users behind one proxy each get their own share; a fleet sharing one worker token
   is counted host by host). A connection past its client's share is answered 429
   ``too_many_requests`` at its first request and closed.
4. **Connections in all** (``CORRAL_MAX_CONNECTIONS``, 10,000, lowered at start to fit the open-file
   limit; ``fit_descriptors``): a connection past it is answered 503 ``unavailable`` at its first
   request and closed. ``REFUSAL_ROOM`` connections more are let in only to be answered so; past
   those, a connection is closed as soon as it is accepted. ``FD_RESERVE`` descriptors are never
   given to connections: the store's connections, the child processes' pipes, log files.

The refusals are answered by ``RefusedConnections`` (an ASGI middleware) rather than written at
accept: a client sends its request right after connecting, and a socket closed with that request
unread is reset, which would lose the answer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import resource
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from corral.server.envelope import error_response
from corral.server.one_write import HeldHead

logger = logging.getLogger("corral.server.connections")

#: open-file descriptors kept for the server's own use, never for connections
FD_RESERVE = 128
#: connections past the limit that are still accepted, to be answered 503 rather than reset
REFUSAL_ROOM = 128
#: where the protocol puts a request's ``Connection`` record in the ASGI scope
CONNECTION_KEY = "corral.connection"

#: (remote address, principal or None before a request authenticated)
ClientKey = tuple[str, str | None]


class Refusal(enum.Enum):
    """Why a connection is answered and closed at its first request."""

    #: the server holds as many connections as it may: 503 ``unavailable``
    FULL = "full"
    #: the client holds its share: 429 ``too_many_requests``
    CLIENT_SHARE = "client_share"


@dataclass(eq=False, slots=True)
class Connection:
    """One open connection, as the book counts it."""

    client: ClientKey
    refusal: Refusal | None = None


class ConnectionBook:
    """Open connections, in all and per client. Used on the event loop only (no lock)."""

    def __init__(self, max_connections: int, max_per_client: int) -> None:
        self.limit = max_connections
        self.per_client = max_per_client
        self.open = 0
        self.by_client: dict[ClientKey, int] = {}
        self.refused: dict[Refusal, int] = dict.fromkeys(Refusal, 0)
        #: connections closed at accept, past the limit and the refusal room
        self.dropped = 0

    def figures(self) -> tuple[int, int, dict[str, int]]:
        """Open connections, the limit, and the refusals by reason (``/metrics``)."""
        refused = {refusal.value: count for refusal, count in self.refused.items()}
        return self.open, self.limit, {**refused, "dropped": self.dropped}

    def fit_descriptors(self, descriptor_limit: int, in_use: int) -> int:
        """Lower the limit so that every connection, refused ones included, fits under the
        open-file limit with ``FD_RESERVE`` to spare; the limit now in force."""
        room = descriptor_limit - in_use - FD_RESERVE - REFUSAL_ROOM
        if room < self.limit:
            self.limit = max(1, room)
        return self.limit

    def opened(self, address: str) -> Connection | None:
        """Count a new connection; None when it must be closed at once (past the refusal room)."""
        if self.open >= self.limit + REFUSAL_ROOM:
            self.dropped += 1
            return None
        connection = Connection((address, None))
        self.open += 1
        count = self.by_client.get(connection.client, 0) + 1
        self.by_client[connection.client] = count
        if self.open > self.limit:
            connection.refusal = Refusal.FULL
        elif count > self.per_client:
            connection.refusal = Refusal.CLIENT_SHARE
        return connection

    def identify(self, connection: Connection, principal: str) -> Refusal | None:
        """A request on ``connection`` authenticated as ``principal``: count the connection under
        that client from now on; ``Refusal.CLIENT_SHARE`` when that is past its share."""
        client = (connection.client[0], principal)
        if client == connection.client:
            return None
        self._leave(connection.client)
        connection.client = client
        count = self.by_client.get(client, 0) + 1
        self.by_client[client] = count
        return Refusal.CLIENT_SHARE if count > self.per_client else None

    def closed(self, connection: Connection) -> None:
        self.open -= 1
        self._leave(connection.client)

    def _leave(self, client: ClientKey) -> None:
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]

    def refusal_response(self, refusal: Refusal) -> Any:
        """The answer to a refused connection (it closes the connection)."""
        self.refused[refusal] += 1
        headers = {"Connection": "close", "Retry-After": "1"}
        if refusal is Refusal.FULL:
            message = f"the server holds its limit of {self.limit} connections: retry later"
            return error_response(503, "unavailable", message, headers)
        message = f"this client holds its share of {self.per_client} open connections: close some"
        return error_response(429, "too_many_requests", message, headers)


class RefusedConnections:
    """Answers the first request of a connection the book refused at accept (503 or 429), and,
    placed after authentication (``identify=True``), counts each connection under the principal
    its request authenticated as."""

    def __init__(self, app: ASGIApp, book: ConnectionBook, identify: bool = False) -> None:
        self.app = app
        self.book = book
        self.identify = identify

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection: Connection | None = scope.get(CONNECTION_KEY)
        if scope["type"] != "http" or connection is None:
            await self.app(scope, receive, send)
            return
        refusal = connection.refusal
        if self.identify and refusal is None:
            principal = scope.get("corral.principal")
            if principal is not None:
                refusal = connection.refusal = self.book.identify(
                    connection, f"{principal.role}:{principal.name}"
                )
        if refusal is not None:
            await self.book.refusal_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol with the header timeout and the connection book, each
    answer written in one write (``one_write``).

    ``guarded_protocol`` makes a subclass bound to one book and timeout (uvicorn makes one
    protocol per connection from the class it is given)."""

    book: ClassVar[ConnectionBook]
    header_timeout_s: ClassVar[float]

    _record: Connection | None = None
    _header_timer: asyncio.TimerHandle | None = None
    _request_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._record = self.book.opened(self.client[0] if self.client else "")
        if self._record is None:
            transport.abort()  # no descriptor to spare for an answer
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._record is not None:
            self.book.closed(self._record)
            self._record = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True
        if self._header_timer is None:  # a kept-alive connection's next request
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        self._request_begun = False
        self.scope[CONNECTION_KEY] = self._record  # type: ignore[literal-required]
        before = getattr(self, "cycle", None)
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        # The request's cycle writes its answer's head and body in one write (``one_write``). An
        # upgrade (a WebSocket) makes no cycle; a HEAD answer has no body to wait for, and uvicorn
        # may close the connection before the end of the turn would send a held head.
        if cycle is not None and cycle is not before and self.scope["method"] != "HEAD":
            cycle.transport = HeldHead(self.transport, self.loop)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._request_begun:
            self.transport.write(_timeout_answer(self.header_timeout_s))
        self.transport.close()


def guarded_protocol(book: ConnectionBook, header_timeout_s: float) -> type[GuardedHttpProtocol]:
    """The protocol class to hand uvicorn (``uvicorn.Config(http=...)``)."""
    attributes = {"book": book, "header_timeout_s": header_timeout_s}
    return type("CorralHttpProtocol", (GuardedHttpProtocol,), attributes)


def _timeout_answer(header_timeout_s: float) -> bytes:
    """The raw 408 sent before closing a connection whose headers were too slow (no route ran)."""
    body = orjson.dumps(
        {
            "error": {
                "code": "request_timeout",
                "message": f"the request headers did not arrive within {header_timeout_s:g} s",
            }
        }
    )
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nx-request-id: {secrets.token_hex(16)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def raise_descriptor_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (systemd gives a unit 1,024
    soft, 524,288 hard); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as error:
            logger.warning("could not raise the open-file limit", extra={"soft": soft, "error": str(error)})
    return soft


def descriptors_in_use() -> int:
    """Open file descriptors of this process (Linux; a guess elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64
