"""A small keep-alive HTTP/1.1 transport for the SDK, on the standard library.

Why not httpx: a worker makes two requests per job (claim, done) plus heartbeats, and on a busy
host its CPU went mostly to the HTTP client (about 440 us per request with httpx against under
100 us with ``http.client``). One connection per thread, kept alive; a request that finds its
reused connection closed by the server is sent once more on a fresh one (the server closes idle
keep-alive connections; nothing was processed on a connection that answered nothing).
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

CONNECT_TIMEOUT_S = 5.0


class TransportError(Exception):
    """The server could not be reached, or the connection broke before an answer came."""


@dataclass
class Response:
    status_code: int
    content: bytes
    reason_phrase: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


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
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            factory = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = factory(self._host, self._port, timeout=CONNECT_TIMEOUT_S)
            self._local.connection = connection
            with self._lock:
                self._all.append(connection)
        return connection

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

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
            connection = self._connection()
            reused = connection.sock is not None
            try:
                connection.timeout = timeout_s or self._timeout_s
                if connection.sock is not None:
                    connection.sock.settimeout(connection.timeout)
                connection.request(method, target, body=body, headers=send_headers)
                answer = connection.getresponse()
                content = answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
                self._drop()
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: send it once more
                raise TransportError(str(error) or type(error).__name__) from error
            except (OSError, http.client.HTTPException) as error:
                self._drop()
                raise TransportError(str(error) or type(error).__name__) from error
            if answer.will_close:
                self._drop()
            return Response(
                status_code=answer.status,
                content=content,
                reason_phrase=answer.reason,
                headers={name.lower(): value for name, value in answer.getheaders()},
            )
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            for connection in self._all:
                connection.close()
            self._all.clear()
