"""The JSON answer and the error envelope every answer of the server is made with.

Apart from ``http`` (which re-exports both) so that the modules the server's state is made of
(``connections``, answering a refused connection) use them without importing ``http``, which
itself reads the state (``state.state_of``): no import cycle.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from corral.protocol.answers import ErrorAnswer, ErrorDetail


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """``{"error": {"code", "message"}}`` with ``status``: every failure's answer."""
    envelope = ErrorAnswer(error=ErrorDetail(code=code, message=message))
    return json_response(envelope.to_wire(), status, headers)
