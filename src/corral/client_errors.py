"""The SDK's errors and default URL, apart from the client so that what only names them (the CLI's
parser and its error handling) does not import the HTTP stack: ``corral --help`` starts without it.
``corral.client`` exports the same names; import them from there.
"""

from __future__ import annotations

from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8765"


class ClientError(Exception):
    """Base of the SDK's errors."""


class ServerUnreachable(ClientError):
    def __init__(self, url: str, error: Exception) -> None:
        super().__init__(f"cannot reach corral server at {url}: {error}")
        self.url = url


class ApiError(ClientError):
    """The server answered with an error status and envelope, or (code ``bad_response``) with an
    answer the SDK could not read; ``body`` is the decoded answer when there was one."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class WaitTimeout(ClientError, TimeoutError):
    """``wait(timeout)`` of a job, gang or array handle ran out before every task ended. ``last``
    is what the server said at the last look (the job, gang or array answer), ``status`` its
    status then (an array's counts in words), so a caller can say why it is still waiting. A
    ``TimeoutError`` too, for code that catches the built-in one."""

    def __init__(self, what: str, timeout_s: float, status: str, last: Any = None, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(f"{what} has not ended after {timeout_s:g} s (status {status}{detail})")
        self.what = what
        self.timeout_s = timeout_s
        self.status = status
        self.last = last
