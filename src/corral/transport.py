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

An ``https://`` URL is verified against ``ca_file`` (``CORRAL_CA_FILE``: the CA of a cluster's own
certificates), else the system's trust store; the host name is always checked. A certificate that
does not verify, an unreadable CA file, or an ``https://`` URL for a server in clear is a
``TlsError`` whose message says what to change, never a bare OpenSSL code; an ``http://`` URL for a
TLS server (which hangs up without a word) is a ``TransportError`` that suggests ``https://``.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from urllib.parse import urlsplit

from corral.http_response import CONNECT_TIMEOUT_S, Response, TlsError, TransportError, request_target

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MAX_IDLE",
    "Response",
    "TlsError",
    "Transport",
    "TransportError",
    "tls_context",
]

#: idle connections kept for reuse; more are closed when they are put back
MAX_IDLE = 16


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The context an ``https://`` connection verifies the server with: ``ca_file`` when given,
    else the system's trust store. Raises ``TlsError`` naming the file when it cannot be read."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as error:
        raise TlsError(
            f"the CA file {ca_file} (CORRAL_CA_FILE) holds no usable certificate: {error.reason or error}"
        ) from error
    except OSError as error:
        raise TlsError(
            f"cannot read the CA file {ca_file} (CORRAL_CA_FILE): {error.strerror or error}"
        ) from error


class Transport:
    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        headers: dict[str, str] | None = None,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        #: sent with every request (the token); never logged
        self._headers = {"content-type": "application/json", **(headers or {})}
        # A malformed URL or an unreadable CA file is reported at the first request, like an
        # unreachable server, so every caller handles one kind of failure.
        self._unusable: TransportError | None = None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self._unusable = TransportError(
                f"server URL must be http://host:port or https://host:port, not {base_url!r}"
            )
        self._https = parts.scheme == "https"
        self._tls: ssl.SSLContext | None = None
        if self._https and self._unusable is None:
            try:
                self._tls = tls_context(ca_file)
            except TlsError as error:
                self._unusable = error
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
        if self._tls is not None:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=CONNECT_TIMEOUT_S, context=self._tls
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=CONNECT_TIMEOUT_S)

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
        if self._unusable is not None:
            raise type(self._unusable)(str(self._unusable))  # a fresh one: no traceback piles up
        target = request_target(self._prefix, path, params)
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
            except ssl.SSLError as error:
                connection.close()
                raise self._tls_error(error) from error
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
                connection.close()
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: send it once more
                if not self._https and not reused:
                    # A TLS server hangs up on a request in clear without a word.
                    raise TransportError(
                        "the server closed the connection without answering; if it serves HTTPS, use an"
                        " https:// URL"
                    ) from error
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

    def _tls_error(self, error: ssl.SSLError) -> TlsError:
        """What went wrong in the TLS handshake, said so that the reader knows what to change."""
        if isinstance(error, ssl.SSLCertVerificationError):
            return TlsError(
                f"the server's TLS certificate is not trusted ({error.verify_message}): point CORRAL_CA_FILE"
                " at the CA certificate that signed it"
            )
        if error.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"):
            return TlsError(
                f"the server does not speak TLS ({error.reason}); if it serves plain HTTP, use an http:// URL"
            )
        return TlsError(f"TLS handshake failed: {error.reason or error}")

    def close(self) -> None:
        """Close the idle connections; one in use is closed when its request ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for connection in idle:
            connection.close()
