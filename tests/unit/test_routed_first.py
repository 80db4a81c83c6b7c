"""The worker heartbeat is routed first (``app.routed_first``), which must not take a path from
the route that answered it before."""

from __future__ import annotations

import pytest
from starlette.responses import Response
from starlette.routing import Route

from corral.server.app import routed_first


async def _answer(request: object) -> Response:
    return Response()


def test_a_route_no_other_matches_goes_first() -> None:
    first = Route("/workers/{worker_id}/heartbeat", _answer, methods=["POST"])
    others = [Route("/workers/{worker_id}", _answer), Route("/workers/{worker_id}/drain", _answer)]

    assert routed_first(first, others) == [first, *others]


def test_a_route_another_would_have_answered_is_refused() -> None:
    first = Route("/pools/{name}", _answer, methods=["PUT"])
    catch_all = Route("/pools/{path:path}", _answer, methods=["PUT"])

    with pytest.raises(ValueError, match="cannot go first"):
        routed_first(first, [catch_all])
