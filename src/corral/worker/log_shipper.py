"""Ship one attempt's output to the server (``POST /jobs/{id}/logs?offset=B``) without ever slowing
the job down, soon after it was written, and without losing the middle of a burst.

The job's output reader (``executor.JobProcess``) hands every chunk it reads to ``write``, which only
appends to a bounded buffer under a lock: the reader never waits for the network, so the job never
blocks on a full pipe however fast it writes. A thread of the shipper sends what is waiting:

1. at once when a full chunk (``chunk_bytes``) is waiting, and a smaller rest once ``delay_s`` passed
   since the last send. A line written after a quiet spell goes out at once; the lines after it are
   batched for at most ``delay_s`` (a follow, ``corral logs -f``, sees them within about that), and
   a large burst goes out in full chunks, one request after another. (The rest used to wait for the
   job heartbeat, 5 s: a follow showed the output in bursts.)
2. as chunks of at most ``chunk_bytes``, each at the offset of the attempt's stream it starts at. The
   chunk in flight is kept until the server acknowledged it: after a lost answer or an unreachable
   server it is sent again at the same offset (after ``RETRY_S``), which the server accepts once;
3. when the job writes faster than the server takes it and the buffer passes ``buffer_bytes``, its
   oldest bytes move to a spill file of the attempt (``spill_path``, in the worker's state
   directory), which is sent first, in order: a burst larger than the buffer arrives whole. The
   file is truncated once sent, and removed when the attempt's shipping ends. Only past
   ``spill_max_bytes`` (or where the file cannot be written: a full disk) are the oldest unsent
   bytes dropped (the server keeps the newest bytes of an attempt too), and a line saying how many
   goes into the stream where they were;
4. ``close`` (after the job's output reached its end) sends what is left, for at most
   ``flush_timeout_s``, before the attempt's final report: a follow sees the whole output once the
   job has ended. A spill not sent within half of that is dropped (with a note), so that the end of
   the output, in the buffer, still goes out.

A 404 or 409 ``stale_attempt`` means the attempt is no longer the job's: shipping stops (the job's
heartbeat stops the job). Any other refusal stops shipping with a warning; the job runs on.

The shipping thread is started by the first chunk written, not by ``start``: most jobs of a busy
worker write little or nothing, and a thread per job that never ships costs the worker a start and
the GIL it takes. ``close`` sends what is left either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from corral.client_errors import ApiError, ServerUnreachable
from corral.worker.calls import WorkerClient

logger = logging.getLogger("corral.worker.logs")

CHUNK_BYTES = 1024 * 1024
BUFFER_BYTES = 8 * 1024 * 1024
FLUSH_TIMEOUT_S = 30.0
#: a rest smaller than a chunk waits at most this long after the last send
DELAY_S = 0.2
#: after a failed send, the next try waits this long
RETRY_S = 0.5
#: the most bytes an attempt's spill file may hold
SPILL_MAX_BYTES = 4 * 1024**3
#: and at most this share of the disk's free space when the spill starts
SPILL_FREE_SHARE = 0.5

#: ``send(offset, data)`` -> where the server's stored stream ends now
Send = Callable[[int, bytes], int]


def drop_note(count: int) -> bytes:
    return (
        f"\n[corral: {count} bytes of output dropped: written faster than they could be shipped]\n".encode()
    )


class Pieces:
    """Bytes kept as the chunks they were written in: appending and taking from the front copy
    (almost) nothing. A bytearray moved its whole content at each removal from its front: once the
    8 MiB buffer was full, 8 MiB for each 64 KiB the job wrote, most of a core at 50 MB/s."""

    def __init__(self) -> None:
        self._pieces: deque[bytes] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, data: bytes) -> None:
        if data:
            self._pieces.append(bytes(data))
            self._size += len(data)

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` of the oldest bytes, removed."""
        taken: list[bytes] = []
        need = limit
        while need > 0 and self._pieces:
            piece = self._pieces[0]
            if len(piece) <= need:
                self._pieces.popleft()
                taken.append(piece)
                need -= len(piece)
            else:
                taken.append(piece[:need])
                self._pieces[0] = piece[need:]
                need = 0
        data = taken[0] if len(taken) == 1 else b"".join(taken)
        self._size -= len(data)
        return data

    def clear(self) -> None:
        self._pieces.clear()
        self._size = 0


class Spill:
    """The oldest unsent bytes of an attempt, on disk: appended at its end, read from its start.

    Opened at the first byte it takes; truncated whenever everything in it was read (so a burst
    costs the disk only while it is being sent); removed by ``close``. ``room`` is what it may
    still take: ``max_bytes`` less what the file holds (read or not), and at most a share of the
    disk's free space when it was opened. Called under the shipper's lock.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._limit = max_bytes
        self._descriptor: int | None = None
        self._read = 0  # where the next read starts
        self._end = 0  # where the next append goes
        self.failed = False  # the file could not be written: spill no more

    def __len__(self) -> int:
        return self._end - self._read

    def room(self) -> int:
        return 0 if self.failed else max(0, self._limit - self._end)

    def append(self, data: bytes | bytearray | memoryview) -> bool:
        """Append ``data`` whole; False (and spill no more) where the file cannot take it."""
        try:
            if self._descriptor is None:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._descriptor = os.open(
                    self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
                )
                free = shutil.disk_usage(self.path.parent).free
                self._limit = min(self._max_bytes, int(free * SPILL_FREE_SHARE))
                if len(data) > self._limit:
                    raise OSError("not enough free disk for the spill")
            written = 0
            view = memoryview(data)
            while written < len(view):
                written += os.pwrite(self._descriptor, view[written:], self._end + written)
        except OSError as error:
            logger.warning("log spill file not written", extra={"path": str(self.path), "error": str(error)})
            self.failed = True
            return False
        self._end += written
        return True

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` of the oldest bytes (removed from the spill)."""
        assert self._descriptor is not None
        data = os.pread(self._descriptor, min(limit, len(self)), self._read)
        self._read += len(data)
        if self._read == self._end:
            os.ftruncate(self._descriptor, 0)
            self._read = self._end = 0
        return data

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._read = self._end = 0


class LogShipper:
    def __init__(
        self,
        send: Send,
        fields: Mapping[str, Any] | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        buffer_bytes: int = BUFFER_BYTES,
        flush_timeout_s: float = FLUSH_TIMEOUT_S,
        delay_s: float = DELAY_S,
        spill_path: Path | None = None,
        spill_max_bytes: int = SPILL_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Without a ``spill_path`` the oldest bytes past the buffer are dropped; ``clock``: a
        test's, to say when it is."""
        self._send = send
        self._fields = dict(fields or {})
        self._chunk_bytes = chunk_bytes
        self._buffer_bytes = buffer_bytes
        self._flush_timeout_s = flush_timeout_s
        self._delay_s = delay_s
        self._clock = clock
        self._lock = threading.Lock()
        self._spill = Spill(spill_path, spill_max_bytes) if spill_path is not None else None
        self._buffer = Pieces()  # the newest unsent bytes (after the spill's, if any)
        self._dropped = 0  # bytes dropped between the spill and the buffer, not yet noted
        self._inflight = b""  # the chunk being sent, kept until acknowledged
        self._last_send = float("-inf")  # when the last chunk was sent (clock)
        self._retry_at = float("-inf")  # after a failed send: not before this (clock)
        self.offset = 0  # where the server's stored stream ends (acknowledged)
        self.dropped_total = 0
        self.spilled_total = 0
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
        """Take a chunk of the job's output: never blocks beyond a short lock (and, past the
        buffer, an append to the spill file), never raises."""
        with self._lock:
            if self._stopped:
                return
            self.written_total += len(chunk)
            was_waiting = self._waiting_bytes()
            self._buffer.append(chunk)
            excess = len(self._buffer) - self._buffer_bytes
            if excess > 0:
                self._make_room(excess)
            wake = not was_waiting or (was_waiting < self._chunk_bytes <= was_waiting + len(chunk))
            idle = not self._running
        if idle:
            self._start_thread()
        if wake:
            self._wake.set()

    def _make_room(self, excess: int) -> None:
        """Move the buffer's oldest ``excess`` bytes to the spill, or drop them (under the lock)."""
        oldest = self._buffer.take(excess)
        spill = self._spill
        if spill is not None:
            note = drop_note(self._dropped) if self._dropped else b""
            if len(note) + excess <= spill.room() and spill.append(note + oldest):
                # A note of bytes dropped before goes where they were: between the spill and these.
                self._dropped = 0
                self.spilled_total += excess
                return
        self._dropped += excess
        self.dropped_total += excess

    def _waiting_bytes(self) -> int:
        spilled = len(self._spill) if self._spill is not None else 0
        return len(self._inflight) + spilled + len(self._buffer) + (1 if self._dropped else 0)

    # --- the shipping thread ---------------------------------------------------------------

    def delay(self, now: float) -> float | None:
        """How long the thread waits before its next send: 0 to send now, None while nothing is
        waiting (a write wakes it)."""
        with self._lock:
            if self._stopped:
                return None
            waiting = self._waiting_bytes()
        if not waiting:
            return None
        if now < self._retry_at:
            return self._retry_at - now
        if waiting >= self._chunk_bytes:
            return 0.0
        return max(0.0, self._last_send + self._delay_s - now)

    def _next_chunk(self) -> bytes:
        """The chunk to send: the one in flight, else the next one taken from the spill, else
        from the buffer (after a note of the bytes dropped before it)."""
        with self._lock:
            if self._inflight:
                return self._inflight
            spill = self._spill
            if spill is not None and len(spill):
                self._inflight = spill.take(self._chunk_bytes)
            elif self._buffer or self._dropped:
                note = drop_note(self._dropped) if self._dropped else b""
                take = max(0, self._chunk_bytes - len(note))
                self._inflight = note + self._buffer.take(take)
                self._dropped = 0
            return self._inflight

    def _pending(self) -> bool:
        with self._lock:
            return not self._stopped and bool(self._waiting_bytes())

    def ship_due(self) -> bool:
        """Send chunks while one is due (``delay`` says 0) and ``close`` has not begun (it sends
        the rest itself); False when a send failed."""
        while not self._closing and self.delay(self._clock()) == 0:
            if not self._send_one():
                return False
        return True

    def _send_one(self) -> bool:
        chunk = self._next_chunk()
        if not chunk:
            return True
        self._last_send = self._clock()
        try:
            size = self._send(self.offset, chunk)
        except ServerUnreachable as error:
            logger.debug(
                "log chunk not sent: server unreachable", extra={**self._fields, "error": str(error)}
            )
            self._retry_at = self._clock() + RETRY_S
            return False
        except ApiError as error:
            if error.status >= 500:
                logger.debug("log chunk refused for now", extra={**self._fields, "error": str(error)})
                self._retry_at = self._clock() + RETRY_S
                return False
            self._stop(error)
            return True
        with self._lock:
            # ``close`` may send beside a send of the thread it stopped waiting for: the same
            # chunk at the same offset, stored once; the answer that comes last clears nothing new.
            if self._inflight is chunk:
                self._inflight = b""
            self.offset = max(self.offset, size)
        return True

    def _drop_spill(self) -> None:
        """Drop what the spill holds unsent: noted, like the bytes dropped past it, before the
        buffer's bytes."""
        with self._lock:
            spill = self._spill
            if spill is None or not len(spill):
                return
            count = len(spill)
            spill.close()
            self._dropped += count
            self.dropped_total += count
        logger.warning(
            "log spill dropped: not sent in time at the end of the attempt",
            extra={**self._fields, "bytes": count},
        )

    def _stop(self, error: ApiError) -> None:
        with self._lock:
            self._stopped = True
            self._buffer.clear()
            self._inflight = b""
            if self._spill is not None:
                self._spill.close()
        lost = error.status == 404 or error.code == "stale_attempt"
        log = logger.info if lost else logger.warning
        log(
            "log shipping stopped: the server refused a chunk",
            extra={**self._fields, "code": error.code, "error": error.message},
        )

    def _run(self) -> None:
        while not self._closing:
            # Cleared before the state is read: a write after this sets it, and the wait ends.
            self._wake.clear()
            delay = self.delay(self._clock())
            if delay != 0:
                self._wake.wait(delay)
                continue
            try:
                self.ship_due()
            except Exception:
                logger.exception("log shipping error", extra=self._fields)
                self._retry_at = self._clock() + RETRY_S

    def abandon(self) -> None:
        """Stop the thread, sending nothing more (after ``close``, or when the attempt is lost);
        the spill file is removed."""
        with self._lock:
            self._stopped = True
            self._closing = True
            # A send in flight holds its chunk in memory: the file is read under the lock alone.
            if self._spill is not None:
                self._spill.close()
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
        """Send what is left within ``flush_timeout_s``. A spill still unsent after half of it is
        dropped (with its note): the output's end, often what says why a job failed, is in the
        buffer after it, and would otherwise be lost behind a spill too large to send in time."""
        start = time.monotonic()
        deadline = start + self._flush_timeout_s
        spill_until = start + self._flush_timeout_s / 2
        retry = RETRY_S
        while self._pending():
            if time.monotonic() >= spill_until:
                self._drop_spill()
            if self._send_one():
                retry = RETRY_S
                continue
            if time.monotonic() + retry > deadline:
                logger.warning(
                    "log shipping gave up: server unreachable at the end of the attempt",
                    extra={**self._fields, "unsent_from": self.offset},
                )
                return
            time.sleep(retry)
            retry = min(retry * 2, 5.0)


def spill_directory(state_dir: Path) -> Path:
    """Where a worker's attempts spill their output: ``<state dir>/log-spill``."""
    return state_dir / "log-spill"


def clear_spills(directory: Path) -> int:
    """Remove the spill files a previous run of the worker left (killed while shipping: nobody
    will send them); the count removed."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def for_attempt(
    client: WorkerClient,
    job_id: str,
    worker_id: str,
    attempt: int,
    fields: Mapping[str, Any],
    delay_s: float = DELAY_S,
    spill_dir: Path | None = None,
    spill_max_bytes: int = SPILL_MAX_BYTES,
) -> LogShipper:
    """A started shipper of one attempt's output through the SDK."""

    def send(offset: int, data: bytes) -> int:
        return client.append_log(job_id, worker_id, attempt, offset, data).size

    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in job_id)
    spill_path = spill_dir / f"{safe}-{attempt}.log" if spill_dir is not None and spill_max_bytes else None
    return LogShipper(
        send,
        fields=fields,
        delay_s=delay_s,
        spill_path=spill_path,
        spill_max_bytes=spill_max_bytes,
    ).start()
