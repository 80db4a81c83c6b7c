"""Delivering a job's outcome to the server despite outages.

An outcome (done, fail, preempted, a watchdog trip) is the one message the server cannot get any
other way: if it is lost, the job sits until its lease expires and is re-run (a 16 s outage once
made finished work run twice). So ``deliver_outcome`` keeps a final outcome until it is delivered or
refused, retrying with backoff (at most ``OUTCOME_MAX_BACKOFF_S`` apart) for as long as the worker lives;
a server that restarts gives workers a lease's grace before reaping, so the retried report lands
on a job still running. Other reports (checkpoints) give up after ``REPORT_TRIES``. A report that
fails for transport reasons (or a 5xx) is retried. A 409 means the server has moved on (another attempt
owns the job, or it already ended): retrying cannot help, so it is logged and dropped. An answer
that cannot be read (``bad_response``: a proxy's page, a truncated body) came after the server got
the report: it counts as delivered, and is neither retried nor followed by another report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from corral.client_errors import ApiError, ServerUnreachable

logger = logging.getLogger("corral.worker.reporting")

REPORT_TRIES = 6
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
#: a final outcome is retried at most this far apart: once the server is back, the report must
#: land within the lease's grace a restarted server gives (a 3 s lease lost the race to an 8 s
#: backoff under load in the chaos suite); one small request every 2 s per pending outcome
OUTCOME_MAX_BACKOFF_S = 2.0


_Answer = TypeVar("_Answer")


def deliver(
    send: Callable[[], _Answer],
    what: str,
    fields: Mapping[str, Any],
    tries: int | None = REPORT_TRIES,
    sleep: Callable[[float], None] = time.sleep,
    max_backoff_s: float = MAX_BACKOFF_S,
) -> _Answer | None:
    """Call ``send`` until it succeeds, is refused, or ``tries`` are spent (None: never spent);
    its answer or None."""
    delay = FIRST_BACKOFF_S
    attempt = 0
    while True:
        attempt += 1
        try:
            return send()
        except ApiError as error:
            if error.code == "bad_response":
                # The server answered, so it most likely took the report; sending it again could
                # only be refused, or worse, count twice. Delivered, its answer unknown.
                logger.warning(
                    f"{what} delivered, but the server's answer was unreadable",
                    extra={**fields, "code": error.code, "error": error.message},
                )
                return None
            if error.status == 409:
                logger.warning(
                    f"{what} refused by the server ({error.code}); dropped",
                    extra={**fields, "code": error.code, "error": error.message},
                )
                return None
            if error.status < 500:
                logger.error(
                    f"{what} rejected by the server ({error.code}); dropped",
                    extra={**fields, "code": error.code, "error": error.message},
                )
                return None
            problem = str(error)
        except ServerUnreachable as error:
            problem = str(error)
        if tries is not None and attempt >= tries:
            logger.error(f"{what} failed {tries} times; giving up", extra={**fields, "error": problem})
            return None
        logger.warning(f"{what} failed; retrying", extra={**fields, "error": problem, "retry_in_s": delay})
        sleep(delay)
        delay = min(delay * 2, max_backoff_s)


def deliver_outcome(
    send: Callable[[], _Answer],
    what: str,
    fields: Mapping[str, Any],
    sleep: Callable[[float], None] = time.sleep,
) -> _Answer | None:
    """A final outcome: kept and retried until it is delivered or refused (see the module doc)."""
    return deliver(send, what, fields, tries=None, sleep=sleep, max_backoff_s=OUTCOME_MAX_BACKOFF_S)
