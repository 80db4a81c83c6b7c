"""The two worker calls whose newer forms the SDK does not speak yet: the batched worker heartbeat
(its per-job answers) and the claim of several jobs at once.

Both are additions to the wire contract a server may not know, so each says when it was not
understood, and the agent falls back to the older form (``corral.worker.agent``):

- ``worker_beat``: ``POST /workers/{id}/heartbeat`` with ``jobs`` in the body, answered
  ``{"jobs": {id: answer}}``. An older server either refuses the unknown field (400) or answers
  ``{}``: the answer is then ``None`` and the jobs' leases were not renewed.
- ``claim_several``: ``GET /jobs/next?worker_id=W&max=N``, answered 200 ``{"items": [claim, ...]}``
  or 204. An older server refuses ``max`` (400, raised as ``ApiError``), or ignores it and
  answers one plain claim (returned as a list of one, with ``understood`` False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral.client import ApiError, Client
from corral.protocol.answers import ClaimAnswer, WorkerHeartbeatAnswer
from corral.worker.fence import HEARTBEAT_BUSY_RETRY_S

#: the most jobs one claim may ask for (the server's bound on ``max``)
MAX_CLAIM = 64


@dataclass
class Claimed:
    """What one claim call brought: the claims, each parsed or the ``bad_response`` error of an
    item that breaks the contract (the agent fails such a job), and whether the server understood
    ``max``."""

    items: list[ClaimAnswer | ApiError]
    understood: bool


def _claim_item(status: int, data: Any) -> ClaimAnswer | ApiError:
    try:
        return ClaimAnswer.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "answer"
        return ApiError(
            status, "bad_response", f"answer breaks the ClaimAnswer schema at {where}: {first['msg']}", data
        )


class WorkerClient(Client):
    """The SDK, plus the batched forms of the worker's calls."""

    def worker_beat(self, worker_id: str, body: dict[str, Any]) -> WorkerHeartbeatAnswer | None:
        """The worker heartbeat; its per-job answers, or None when the server gave none (an older
        server that ignores ``jobs``, or a body without jobs)."""
        response = self.request(
            "POST", f"/workers/{worker_id}/heartbeat", body, busy_retry_s=HEARTBEAT_BUSY_RETRY_S
        )
        data = self._decode(response)
        if not isinstance(data, dict) or data.get("jobs") is None:
            return None
        try:
            return WorkerHeartbeatAnswer.model_validate(data)
        except ValidationError as error:
            raise ApiError(
                response.status_code,
                "bad_response",
                f"answer breaks the WorkerHeartbeatAnswer schema: {error}",
                data,
            ) from error

    def claim_several(
        self, worker_id: str, wait_s: float, max_jobs: int, idempotency_key: str | None = None
    ) -> Claimed:
        """Claim up to ``max_jobs`` jobs (see the module doc); ``ApiError`` 400 from an older server.
        ``idempotency_key``: as for ``Client.claim``."""
        response = self._claim_request(worker_id, wait_s, idempotency_key, max(1, min(MAX_CLAIM, max_jobs)))
        data = self._decode(response)
        if data is None:
            return Claimed([], True)
        if isinstance(data, dict) and isinstance(data.get("items"), list) and "command" not in data:
            return Claimed([_claim_item(response.status_code, item) for item in data["items"]], True)
        # One plain claim: the server did not read ``max``.
        return Claimed([_claim_item(response.status_code, data)], False)
