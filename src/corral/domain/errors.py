"""One hierarchy of faults, each with a stable code and an HTTP status.

The docstring of each class is its default message. Expected outcomes ("does not fit") are not
exceptions: they are ``Reason`` values returned by the core.
"""

from __future__ import annotations


class CorralError(Exception):
    """Something went wrong in corral."""

    code = "internal"
    http_status = 500

    def __init__(self, message: str | None = None, **details: object) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        self.details = details
        super().__init__(self.message)


class InvalidRequest(CorralError):
    """The request is malformed or a field is out of range."""

    code = "invalid_request"
    http_status = 400

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.field = field


class Unauthenticated(CorralError):
    """A valid token is required."""

    code = "unauthenticated"
    http_status = 401


class Forbidden(CorralError):
    """This token's role may not do this."""

    code = "forbidden"
    http_status = 403


class NotFound(CorralError):
    """No such object."""

    code = "not_found"
    http_status = 404


class TooLarge(CorralError):
    """The request body is over its limit."""

    code = "too_large"
    http_status = 413


class RequestTimeout(CorralError):
    """The request body did not arrive in time."""

    code = "request_timeout"
    http_status = 408


class Conflict(CorralError):
    """The current state does not allow this request; nothing was changed."""

    code = "conflict"
    http_status = 409


class NotRunning(Conflict):
    """The job is not running."""

    code = "not_running"


class StaleAttempt(Conflict):
    """This worker or attempt is no longer the job's current one: stop the job."""

    code = "stale_attempt"


class StaleEpoch(Conflict):
    """The epoch is not the job's current one."""

    code = "stale_epoch"


class NotPreempting(Conflict):
    """The job is not preempting."""

    code = "not_preempting"


class AlreadyTerminal(Conflict):
    """The job has already finished."""

    code = "already_terminal"


class StoreUnavailable(CorralError):
    """The store did not answer."""

    code = "store_unavailable"
    http_status = 503
    #: seconds a client should wait before sending the request again, where sending it again is
    #: safe (nothing was changed); None: no advice (whether the request was applied is not known)
    retry_after_s: int | None = None


class StoreBusy(StoreUnavailable):
    """The store is busy (locked by another writer): nothing was changed; retry after a moment.

    Answered 503 with ``Retry-After``: the transaction did not take its lock in time, or was rolled
    back (a lock or statement timeout, a deadlock, a serialization failure), so sending the same
    request again is safe."""

    code = "store_busy"
    retry_after_s = 1


class StoreRefused(StoreUnavailable):
    """The store is failing, so this request was refused before it reached the store: nothing was
    changed; retry after a moment.

    Answered 503 with the code of the store's failure (``store_busy`` or ``store_unavailable``) and
    ``Retry-After``, at once rather than after waiting out the store's busy timeout in a queue
    (``server.store_gate``). Not itself a failure of the store: it tells the server nothing new."""

    retry_after_s = 1

    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class OutcomeUnknown(StoreUnavailable):
    """The server's process that was applying this request ended before it answered: whether the
    request was applied is not known; sent with an Idempotency-Key, sending it again with that key
    finds out (a replay answers what was stored); sent without one, its jobs are looked for first.

    Answered 503 ``store_unavailable`` without ``Retry-After`` (sending it again without its key
    may apply it twice). Not a failure of the store: the child process (``server.offload``) ended,
    the store did not, so the server goes on taking writes (``http.note_store_failure``)."""


class StoreWriteFailed(StoreUnavailable):
    """The store cannot write now (a full disk, an I/O error, a read-only database): nothing was
    changed; retry after a moment.

    Answered 503 ``store_unavailable`` with ``Retry-After``, never a 500: the fault is the
    store's, the request was refused whole (its transaction rolled back), and it succeeds once the
    store takes writes again. ``/readyz`` answers 503 while writes fail."""

    retry_after_s = 1
