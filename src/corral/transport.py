"""A small keep-alive HTTP/1.1 transport for the SDK, on the standard library.

Why not httpx: a worker makes two requests per job (claim, done) plus heartbeats, and on a busy
host its CPU went mostly to the HTTP client (about 440 us per request with httpx against under
100 us with ``http.client``). Connections are kept alive in a pool: a request takes an idle one
(or opens one when none is idle) and puts it back once answered, so a thread that makes a few
requests and ends (one per job on a worker) reuses a connection instead of opening its own, and
the pool holds no more connections than were ever in use at once (``MAX_IDLE`` at most idle). A
request that finds its reused connection closed by the server is sent once more on a fresh one
(the server closes idle keep-alive connections; nothing was processed on a connection that
answered nothing).
"""

from __future__ import annotations

import http.client
import threading
from urllib.parse import urlencode, urlsplit

from corral.http_response import CONNECT_TIMEOUT_S, Response, TransportError

__all__ = ["CONNECT_TIMEOUT_S", "MAX_IDLE", "Response", "Transport", "TransportError"]

#: idle connections kept for reuse; more are closed when they are put back
MAX_IDLE = 16


class Transport:
    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        #: sent with every request (the token); never logged
        self._headers = {"content-type": "application/json", **(headers or {})}
        # A malformed URL is reported at the first request, like an unreachable server, so every
        # caller handles one kind of failure.
        self._bad_url = None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self._bad_url = f"server URL must be http://host:port or https://host:port, not {base_url!r}"
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._idle: list[http.client.HTTPConnection] = []  # most recently used last
        self._lock = threading.Lock()
        self._closed = False

    def _take(self) -> http.client.HTTPConnection:
        """An idle connection (the most recently used: the least likely to be closed by the
        server), else a new one; the caller has it to itself until ``_put_back``."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        factory = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return factory(self._host, self._port, timeout=CONNECT_TIMEOUT_S)

    def _put_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE and not self._closed:
                self._idle.append(connection)
                return
        connection.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        params: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        if self._bad_url is not None:
            raise TransportError(self._bad_url)
        target = self._prefix + path
        if params:
            target += "?" + urlencode({key: value for key, value in params.items() if value is not None})
        send_headers = {**self._headers, **(headers or {})}
        for attempt in (1, 2):
            connection = self._take()
            reused = connection.sock is not None
            try:
                connection.timeout = timeout_s or self._timeout_s
                if connection.sock is not None:
                    connection.sock.settimeout(connection.timeout)
                connection.request(method, target, body=body, headers=send_headers)
                answer = connection.getresponse()
                content = answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
                connection.close()
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: send it once more
                raise TransportError(str(error) or type(error).__name__) from error
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                raise TransportError(str(error) or type(error).__name__) from error
            except BaseException:
                connection.close()  # a half-used connection is never reused
                raise
            if answer.will_close:
                connection.close()
            else:
                self._put_back(connection)
            return Response(
                status_code=answer.status,
                content=content,
                reason_phrase=answer.reason,
                headers={name.lower(): value for name, value in answer.getheaders()},
            )
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the idle connections; one in use is closed when its request ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for connection in idle:
            connection.close()
