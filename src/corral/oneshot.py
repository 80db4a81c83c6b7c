"""A one-request-per-connection HTTP client on a plain socket, for short-lived processes (the CLI).

Why not ``corral.transport``: it is built on ``http.client``, whose import (``email``'s parser and
``ssl`` with it) is a third of what ``corral jobs`` spends before its first byte (issue 23: the
everyday commands must start at once). A CLI command makes one or two requests, so it needs no
connection pool: each request opens a connection, sends HTTP/1.0 (the server then frames the answer
by closing the connection, never in chunks) and reads to the end. ``https://`` URLs keep the full
transport (TLS lives there); ``Client(light=True)`` picks this one for ``http://``.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from corral.http_response import CONNECT_TIMEOUT_S, Response, TransportError, request_target

_READ_SIZE = 65536
#: a TLS server hangs up on a request in clear without a word (as ``Transport`` says too)
_NO_ANSWER = "the server closed the connection without answering; if it serves HTTPS, use an https:// URL"


class OneShotTransport:
    """``Transport``'s ``request`` and ``close``, for ``http://`` URLs only."""

    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"OneShotTransport takes http:// URLs, not {base_url!r}")
        #: sent with every request (the token); never logged
        self._headers = {"content-type": "application/json", **(headers or {})}
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        params: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        target = request_target(self._prefix, path, params)
        sent = {**self._headers, **(headers or {}), "host": f"{self._host}:{self._port}"}
        if body is not None:
            sent["content-length"] = str(len(body))
        head = f"{method} {target} HTTP/1.0\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in sent.items()
        )
        try:
            with socket.create_connection((self._host, self._port), timeout=CONNECT_TIMEOUT_S) as connection:
                connection.settimeout(timeout_s or self._timeout_s)
                connection.sendall(head.encode("latin-1") + b"\r\n" + (body or b""))
                answer = _read_all(connection)
        except (ConnectionResetError, BrokenPipeError) as error:
            raise TransportError(_NO_ANSWER) from error
        except OSError as error:
            raise TransportError(str(error) or type(error).__name__) from error
        if not answer:
            raise TransportError(_NO_ANSWER)
        return _parse(answer)

    def close(self) -> None:
        """Nothing to close: no connection outlives its request."""


def _read_all(connection: socket.socket) -> bytes:
    pieces: list[bytes] = []
    while True:
        piece = connection.recv(_READ_SIZE)
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)


def _parse(answer: bytes) -> Response:
    """The status line, the headers (names lower-cased; a repeated one keeps its last value, as
    ``Transport`` does) and the body, which the server ended by closing the connection."""
    head, separator, content = answer.partition(b"\r\n\r\n")
    if not separator:
        raise TransportError("the connection closed before the answer's headers ended")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    try:
        _, code, *reason = status_line.split(" ", 2)
        status = int(code)
    except ValueError:
        raise TransportError(f"not an HTTP answer: {status_line[:80]!r}") from None
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":  # never to HTTP/1.0; kept safe
        content = _unchunk(content)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if len(content) < length:
            raise TransportError(f"the answer ended after {len(content)} of {length} bytes")
        content = content[:length]
    return Response(status, content, reason[0] if reason else "", headers)


def _unchunk(data: bytes) -> bytes:
    body: list[bytes] = []
    position = 0
    while True:
        end = data.find(b"\r\n", position)
        if end < 0:
            raise TransportError("a chunked answer ended early")
        size = int(data[position:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(body)
        body.append(data[end + 2 : end + 2 + size])
        position = end + 2 + size + 2
