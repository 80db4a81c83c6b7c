"""What both HTTP transports share (``corral.transport`` over ``http.client``, and
``corral.oneshot`` on a plain socket): the ``Response``, the ``TransportError`` and the
``TlsError`` they answer with, and the request target they send; apart from either so that the
light one imports nothing of ``http.client``.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

#: how long opening a connection may take
CONNECT_TIMEOUT_S = 5.0


def request_target(prefix: str, path: str, params: Mapping[str, object] | None = None) -> str:
    """The target of a request line: the server URL's own path (``prefix``, no trailing slash:
    a server behind a path of a proxy), the route's ``path``, and the query of ``params`` (a
    parameter whose value is None is left out)."""
    target = prefix + path
    if params:
        target += "?" + urlencode({key: value for key, value in params.items() if value is not None})
    return target


class TransportError(Exception):
    """The server could not be reached, or the connection broke before an answer came."""


class TlsError(TransportError):
    """The connection could not be secured: the server's certificate is not trusted, the CA file
    cannot be read, or the client and the server disagree on whether to speak TLS at all."""


class Response:
    """An answer: status, body and headers (names lower-cased). A plain class, not a dataclass:
    ``dataclasses`` (with ``inspect`` and ``ast``) is a third of what ``corral jobs`` would
    otherwise import before its first request (issue 23)."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code")

    def __init__(
        self,
        status_code: int,
        content: bytes,
        reason_phrase: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status_code = status_code
        self.content = content
        self.reason_phrase = reason_phrase
        self.headers = headers if headers is not None else {}

    def __repr__(self) -> str:
        return f"Response({self.status_code}, {len(self.content)} bytes)"

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")
