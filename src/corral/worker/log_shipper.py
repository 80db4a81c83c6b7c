"""Ship one attempt's output to the server (``POST /jobs/{id}/logs?offset=B``) without ever slowing
the job down.

The job's output reader (``executor.JobProcess``) hands every chunk it reads to ``write``, which only
appends to a bounded buffer under a lock: the reader never waits for the network, so the job never
blocks on a full pipe however fast it writes. A thread of the shipper sends what the buffer holds:

1. every ``interval_s`` (the job heartbeat's period), and at once when ``chunk_bytes`` are waiting;
2. as chunks of at most ``chunk_bytes``, each at the offset of the attempt's stream it starts at. The
   chunk in flight is kept until the server acknowledged it: after a lost answer or an unreachable
   server it is sent again at the same offset, which the server accepts once;
3. when the job writes faster than the server takes it and the buffer passes ``buffer_bytes``, the
   oldest unsent bytes are dropped (the server keeps the newest bytes of an attempt too), and a line
   saying how many goes into the stream where they were;
4. ``close`` (after the job's output reached its end) sends what is left, for at most
   ``flush_timeout_s``, before the attempt's final report: a follow sees the whole output once the
   job has ended.

A 404 or 409 ``stale_attempt`` means the attempt is no longer the job's: shipping stops (the job's
heartbeat stops the job). Any other refusal stops shipping with a warning; the job runs on.

The shipping thread is started by the first chunk written, not by ``start``: most jobs of a busy
worker write little or nothing, and a thread per job that never ships costs the worker a start, a
wake-up every ``interval_s`` and the GIL they take. ``close`` sends what is left either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from corral.client import ApiError, Client, ServerUnreachable

logger = logging.getLogger("corral.worker.logs")

CHUNK_BYTES = 1024 * 1024
BUFFER_BYTES = 8 * 1024 * 1024
FLUSH_TIMEOUT_S = 30.0
#: after a failed send, the next try waits this long (doubling up to ``interval_s``)
RETRY_S = 0.5

#: ``send(offset, data)`` -> where the server's stored stream ends now
Send = Callable[[int, bytes], int]


def drop_note(count: int) -> bytes:
    return (
        f"\n[corral: {count} bytes of output dropped: written faster than they could be shipped]\n".encode()
    )


class LogShipper:
    def __init__(
        self,
        send: Send,
        interval_s: float,
        fields: Mapping[str, Any] | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        buffer_bytes: int = BUFFER_BYTES,
        flush_timeout_s: float = FLUSH_TIMEOUT_S,
    ) -> None:
        self._send = send
        self._interval_s = interval_s
        self._fields = dict(fields or {})
        self._chunk_bytes = chunk_bytes
        self._buffer_bytes = buffer_bytes
        self._flush_timeout_s = flush_timeout_s
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._dropped = 0  # bytes dropped from the buffer and not yet noted in the stream
        self._inflight = b""  # the chunk being sent, kept until acknowledged
        self.offset = 0  # where the server's stored stream ends (acknowledged)
        self.dropped_total = 0
        self.written_total = 0
        self._wake = threading.Event()
        self._closing = False
        self._stopped = False  # the server refused: ship nothing more
        # Made by the first chunk (most jobs of a busy worker write nothing: a Thread object alone is
        # a Condition, an Event and a name to format, a noticeable part of a short job's cost).
        self._thread: threading.Thread | None = None
        self._started = False  # ``start`` was called: the first chunk starts the thread
        self._running = False  # the thread was started

    def start(self) -> LogShipper:
        with self._lock:
            self._started = True
            pending = bool(self._buffer)
        if pending:
            self._start_thread()
        return self

    def _start_thread(self) -> None:
        with self._lock:
            if self._running or not self._started or self._closing:
                return
            self._running = True
            thread = self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        thread.start()

    # --- the job's side --------------------------------------------------------------------

    def write(self, chunk: bytes) -> None:
        """Take a chunk of the job's output: never blocks beyond a short lock, never raises."""
        with self._lock:
            if self._stopped:
                return
            self.written_total += len(chunk)
            self._buffer += chunk
            excess = len(self._buffer) - self._buffer_bytes
            if excess > 0:
                del self._buffer[:excess]
                self._dropped += excess
                self.dropped_total += excess
            ready = len(self._buffer) >= self._chunk_bytes
            idle = not self._running
        if idle:
            self._start_thread()
        if ready:
            self._wake.set()

    # --- the shipping thread ---------------------------------------------------------------

    def _next_chunk(self) -> bytes:
        """The chunk to send: the one in flight, else the next one taken from the buffer (after a
        note of the bytes dropped before it)."""
        with self._lock:
            if not self._inflight and (self._buffer or self._dropped):
                note = drop_note(self._dropped) if self._dropped else b""
                take = max(0, self._chunk_bytes - len(note))
                self._inflight = note + bytes(self._buffer[:take])
                del self._buffer[:take]
                self._dropped = 0
            return self._inflight

    def _pending(self) -> bool:
        with self._lock:
            return not self._stopped and bool(self._inflight or self._buffer or self._dropped)

    def _ship_some(self) -> bool:
        """Send chunks until the buffer is empty; False when a send failed (try again later)."""
        while self._pending():
            chunk = self._next_chunk()
            try:
                size = self._send(self.offset, chunk)
            except ServerUnreachable as error:
                logger.debug(
                    "log chunk not sent: server unreachable", extra={**self._fields, "error": str(error)}
                )
                return False
            except ApiError as error:
                if error.status >= 500:
                    logger.debug("log chunk refused for now", extra={**self._fields, "error": str(error)})
                    return False
                self._stop(error)
                return True
            with self._lock:
                self._inflight = b""
                self.offset = size
        return True

    def _stop(self, error: ApiError) -> None:
        with self._lock:
            self._stopped = True
            self._buffer.clear()
            self._inflight = b""
        lost = error.status == 404 or error.code == "stale_attempt"
        log = logger.info if lost else logger.warning
        log(
            "log shipping stopped: the server refused a chunk",
            extra={**self._fields, "code": error.code, "error": error.message},
        )

    def _run(self) -> None:
        delay = self._interval_s
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            if self._closing:
                return
            try:
                shipped = self._ship_some()
            except Exception:
                logger.exception("log shipping error", extra=self._fields)
                shipped = False
            delay = self._interval_s if shipped else min(self._interval_s, RETRY_S)

    def abandon(self) -> None:
        """Stop the thread, sending nothing more (after ``close``, or when the attempt is lost)."""
        with self._lock:
            self._stopped = True
            self._closing = True
        self._wake.set()

    def close(self) -> None:
        """After the job's output ended: stop the thread and send what is left (bounded in time).
        Never raises: the attempt's report must go out whatever happened to its output."""
        with self._lock:
            self._closing = True
        self._wake.set()
        # A thread started a moment ago but not yet alive sees ``_closing`` before it ships.
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=self._flush_timeout_s)
        try:
            self._flush()
        except Exception:
            logger.exception("log shipping error at the end of the attempt", extra=self._fields)
        self.abandon()

    def _flush(self) -> None:
        deadline = time.monotonic() + self._flush_timeout_s
        retry = RETRY_S
        while self._pending():
            if self._ship_some():
                return
            if time.monotonic() + retry > deadline:
                logger.warning(
                    "log shipping gave up: server unreachable at the end of the attempt",
                    extra={**self._fields, "unsent_from": self.offset},
                )
                return
            time.sleep(retry)
            retry = min(retry * 2, 5.0)


def for_attempt(
    client: Client, job_id: str, worker_id: str, attempt: int, interval_s: float, fields: Mapping[str, Any]
) -> LogShipper:
    """A started shipper of one attempt's output through the SDK."""

    def send(offset: int, data: bytes) -> int:
        return client.append_log(job_id, worker_id, attempt, offset, data).size

    return LogShipper(send, interval_s, fields).start()
