"""Limits per client, so a hostile or broken one cannot hold the server's sockets.

Probing found 800 sockets trickling a request body kept open for 92 s. Two limits:

1. **A body read timeout** (``CORRAL_BODY_TIMEOUT_S``, default 30 s): a request body not fully
   received in that time is answered 408 ``request_timeout`` and its connection closed
   (``http.read_body`` reads the deadline this middleware puts in the scope).
2. **Concurrent requests per client address** (``CORRAL_MAX_REQUESTS_PER_CLIENT``, default 256):
   past it, 429 ``too_many_requests`` at once. A request in flight holds its connection (HTTP/1.1
   serves one request at a time per connection), so this caps the connections a client can keep
   busy; idle connections are closed after ``CORRAL_IDLE_TIMEOUT_S``, and the connections a client
   may hold at all are capped too (``server.connections``). Every corral worker holds at
   most a few requests (a claim long-poll, a heartbeat, a report), so the default leaves room for
   dozens of workers behind one NAT address.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from corral.server.http import error_response

BODY_DEADLINE_KEY = "corral.body_timeout_s"


class ClientLimitsMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        body_timeout_s: float,
        max_requests_per_client: int,
        in_flight: dict[str, int] | None = None,
    ) -> None:
        """``in_flight``: address -> requests in flight, kept by this middleware (the server state's,
        so that a test can wait on it)."""
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.max_requests = max_requests_per_client
        self.in_flight: dict[str, int] = {} if in_flight is None else in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[BODY_DEADLINE_KEY] = self.body_timeout_s
        client = scope.get("client")
        address = client[0] if client else ""
        count = self.in_flight.get(address, 0)
        if count >= self.max_requests:
            response = error_response(
                429,
                "too_many_requests",
                f"more than {self.max_requests} requests in flight from this address",
                headers={"Connection": "close", "Retry-After": "1"},
            )
            await response(scope, receive, send)
            return
        self.in_flight[address] = count + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[address] - 1
            if left:
                self.in_flight[address] = left
            else:
                del self.in_flight[address]
