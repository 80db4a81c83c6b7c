"""A worker's final reports in batches (issue 26): the done and fail reports of attempts ending
within a short window travel in one request (``POST /workers/{id}/reports``), answered per report.

Each attempt's thread hands its report to ``FinalReports.send`` and waits for its own outcome, as
it waited for its own request before: the first report of a window waits ``window_s`` (or until
the batch is full) for the others, sends them all, and hands each thread its own answer. So the
delivery rules stay the single report's (``corral.worker.reporting.deliver_outcome``): a report
refused (409) is dropped, one the whole request failed for (unreachable, 5xx) is sent again, and a
report already applied whose answer was lost is refused when sent again (the server's fence).

A window of 0 turns batching off; a server without the route (404) makes every report go by its
own route (``POST /jobs/{id}/done``, ``/fail``) from then on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.client_errors import ApiError

logger = logging.getLogger("corral.worker.final_reports")

#: the most reports one request carries (the server's bound: one transaction)
MAX_BATCH = 64


class BatchSender(Protocol):
    def final_reports(
        self, worker_id: str, reports: list[dict[str, Any]]
    ) -> list[ApiError | None] | None: ...


@dataclass
class _Waiting:
    """One report waiting for its batch's answer."""

    report: dict[str, Any]
    answered: threading.Event = field(default_factory=threading.Event)
    #: the report's own refusal, or the whole request's failure
    error: BaseException | None = None
    #: the report goes by its own route (the server has no batch route, or refused the request)
    alone: bool = False


class FinalReports:
    """Gathers the final reports of one worker's attempts into batches (see the module doc)."""

    def __init__(self, worker_id: str, window_s: float) -> None:
        self._worker_id = worker_id
        self._window_s = window_s
        self._condition = threading.Condition()
        self._waiting: list[_Waiting] = []
        #: False once the server answered that it has no batch route
        self._supported = window_s > 0

    @property
    def batching(self) -> bool:
        """Whether reports still go in batches (a window, and a server that has the route)."""
        return self._supported

    def done(self, client: BatchSender, job_id: str, attempt: int, single: Callable[[], Any]) -> None:
        """Report the attempt done, in a batch; ``single`` sends it by its own route instead (batching
        off, or a server without the batch route). Raises as ``single`` would. ``client``: the
        attempt's own (the one that sends the batch it leads)."""
        self.send(client, {"job_id": job_id, "attempt": attempt, "outcome": "done"}, single)

    def fail(
        self, client: BatchSender, job_id: str, attempt: int, body: dict[str, Any], single: Callable[[], Any]
    ) -> None:
        """Report the attempt failed (``body``: the fail route's body), as ``done`` does."""
        self.send(client, {"job_id": job_id, "attempt": attempt, "outcome": "fail", **body}, single)

    def send(self, client: BatchSender, report: dict[str, Any], single: Callable[[], Any]) -> None:
        """One report, sent with the others of its window; its own refusal or the request's failure
        raised, as its own route's call raises them."""
        if not self._supported:
            single()
            return
        waiting = _Waiting(report)
        with self._condition:
            leads = not self._waiting
            self._waiting.append(waiting)
            if len(self._waiting) >= MAX_BATCH:
                self._condition.notify_all()
            if leads:
                # The first of a window gathers the others, then sends them all.
                deadline = time.monotonic() + self._window_s
                while len(self._waiting) < MAX_BATCH:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._condition.wait(remaining)
                gathered, self._waiting = self._waiting, []
        if leads:
            # whoever comes meanwhile leads the next window
            for start in range(0, len(gathered), MAX_BATCH):
                self._send(client, gathered[start : start + MAX_BATCH])
        waiting.answered.wait()
        if waiting.alone:
            single()
        elif waiting.error is not None:
            raise waiting.error

    def _send(self, client: BatchSender, batch: list[_Waiting]) -> None:
        """One request for ``batch``; every waiting report answered, whatever happens."""
        try:
            outcomes = client.final_reports(self._worker_id, [waiting.report for waiting in batch])
        except ApiError as error:
            if error.status in (400, 413):
                # The request as a whole was refused (its body over a limit, say), not its
                # reports: each goes by its own route, and gets its own answer there.
                for waiting in batch:
                    waiting.alone = True
            else:  # every report of it fails alike, and is sent again (a 5xx), or dropped
                for waiting in batch:
                    waiting.error = error
        except BaseException as error:  # every report of it fails alike, and is sent again
            for waiting in batch:
                waiting.error = error
        else:
            if outcomes is None:
                if self._supported:
                    logger.info("the server has no batched final reports; each goes by its own route")
                self._supported = False
                for waiting in batch:
                    waiting.alone = True
            else:
                for waiting, outcome in zip(batch, outcomes, strict=True):
                    waiting.error = outcome
        finally:
            for waiting in batch:
                waiting.answered.set()
