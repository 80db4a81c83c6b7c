"""The worker's side of a preemption's checkpoint phase: hint the job, wait for its save, upload it.

For a victim whose checkpoint mode is ``auto`` or ``manual`` the server first answers the job's
heartbeats with ``{"action": "checkpoint", "preemption_epoch": N, "deadline_s": s}``, and with
``preempt`` once the phase is over (it received the checkpoint, or the deadline passed). For the
first such answer of epoch N the worker:

1. removes the job's done file (``CORRAL_CHECKPOINT_DONE_FILE``) and notes the state of its defer
   file (``CORRAL_DEFER_FILE``): nothing written before the hint answers it;
2. sends SIGUSR1, once, to every process of the job's tree that catches it, whatever shell or
   launcher wraps it (``JobProcess.hint``: a process without a handler would die of it, so until
   one has one the hint is tried again every ``HINT_RETRY_S`` rather than sent);
3. waits, in a thread of its own so the heartbeats go on, for the job to create the done file
   (``jobkit.on_checkpoint`` does, after its callback; a shell job ``touch``-es it);
4. uploads what ``CORRAL_CHECKPOINT_OUT`` holds at that moment with ``?epoch=N``, which ends the
   phase on the server; the ``preempt`` answer that follows takes the usual stop path (SIGTERM,
   grace, SIGKILL, the ack), and the attempt's end does not upload the same bytes again.

What "saved" means is the job's to say: the file's content then is uploaded even when it predates
the hint (a job that saves every few steps may find its last save good enough). A job that says
"saved" with nothing in the file uploads nothing, since an upload needs bytes: the server's deadline
then ends the phase.

While the phase waits for the save, every heartbeat asks ``pending_deferral``: a number of seconds
the job wrote to its defer file since the hint (``jobkit.defer``, or ``echo 120 >
"$CORRAL_DEFER_FILE"``) goes out once as ``defer_s``; each new write is a new request. A heartbeat
that did not reach the server (unreachable) sends it again with the next one.

A phase ends without an upload when the job's process exits, a stop begins (the deadline's
``preempt``, a watchdog, a shutdown), the server stops asking (a plain answer: the preemption was
called off), or a newer epoch's phase begins. The attempt's end then uploads what is left, through
the same ``AttemptUploads``, so the phase's upload and the end's never race and never repeat.

The same phase, with no epoch, is the warning before a job's walltime ends it
(``corral.worker.walltime``): the worker starts it on its own, the upload goes without an epoch
(fenced by the attempt), and the limit's stop ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corral.worker import job_files
from corral.worker.checkpoints import AttemptUploads
from corral.worker.executor import Hint

logger = logging.getLogger("corral.worker.checkpoint")

#: How often the phase looks for the job's done file (one ``stat``).
POLL_S = 0.1
#: How often a hint the job cannot take yet (no SIGUSR1 handler) is tried again.
HINT_RETRY_S = 1.0
#: The largest deferral the heartbeat body accepts (``JobHeartbeatBody.defer_s``).
MAX_DEFER_S = 86400.0
#: The signal that asks a job for a checkpoint.
HINT_SIGNAL = signal.SIGUSR1

_Signature = tuple[int, int, int]


class Hintable(Protocol):
    def hint(self, signal_number: int) -> Hint: ...


@dataclass(frozen=True)
class Deferral:
    """A request for more time the job wrote; ``signature`` tells it from the next one."""

    seconds: float
    signature: _Signature


def _signature(path: Path) -> _Signature | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino)


class CheckpointPhase:
    """Epoch ``epoch``'s checkpoint phase for one attempt (None: the walltime warning's, which no
    preemption asked for); ``start`` begins it, ``end`` stops it."""

    def __init__(
        self,
        epoch: int | None,
        deadline_s: float | None,
        process: Hintable,
        uploads: AttemptUploads,
        done_file: Path,
        defer_file: Path,
        fields: Mapping[str, Any],
        poll_s: float = POLL_S,
        hint_retry_s: float = HINT_RETRY_S,
    ) -> None:
        self.epoch = epoch
        self.deadline_s = deadline_s
        self.fields = (
            {**fields, "preemption_epoch": epoch} if epoch is not None else {**fields, "walltime": True}
        )
        self._process = process
        self._uploads = uploads
        self._done_file = done_file
        self._defer_file = defer_file
        self._poll_s = poll_s
        self._hint_retry_s = hint_retry_s
        self._ended = threading.Event()
        #: the job said its save is complete
        self.saved = threading.Event()
        #: the hint went out
        self.hinted = threading.Event()
        #: whether the phase's upload stored the checkpoint; None until it was tried
        self.uploaded: bool | None = None
        self._deferral_seen = _signature(defer_file)
        self._thread: threading.Thread | None = None

    # --- from the heartbeat thread -----------------------------------------------------------

    def start(self) -> None:
        logger.info("checkpoint requested", extra={**self.fields, "deadline_s": self.deadline_s})
        try:
            self._done_file.unlink(missing_ok=True)
        except OSError as error:
            logger.warning("cannot clear the job's done file", extra={**self.fields, "error": str(error)})
        self._thread = threading.Thread(
            target=self._run,
            name=f"checkpoint-{self.fields.get('job_id')}-{'walltime' if self.epoch is None else self.epoch}",
            daemon=True,
        )
        self._thread.start()

    def renew(self, deadline_s: float | None) -> None:
        """The same epoch asked again: only the deadline may have moved (a deferral, the
        extension for a job that still beats); nothing is signalled again."""
        if deadline_s is not None and self.deadline_s is not None and deadline_s > self.deadline_s + 1:
            logger.info(
                "checkpoint deadline extended",
                extra={**self.fields, "deadline_s": deadline_s, "was_s": self.deadline_s},
            )
        self.deadline_s = deadline_s

    def end(self, why: str) -> None:
        """Stop waiting for the job's save (returns at once); idempotent."""
        if self._ended.is_set():
            return
        self._ended.set()
        if not self.saved.is_set():
            logger.info("checkpoint phase ended before the job's save", extra={**self.fields, "why": why})

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def pending_deferral(self) -> Deferral | None:
        """A request for more time the job wrote since the hint and the server has not had yet;
        only while the phase waits for the save. One ``stat``, and a read when the file changed."""
        if self._ended.is_set() or self.saved.is_set():
            return None
        signature = _signature(self._defer_file)
        if signature is None or signature == self._deferral_seen:
            return None
        # Bounded and never waiting: the job may have made it a FIFO, a link to /dev/zero, megabytes.
        raw = job_files.read_value(self._defer_file, job_files.DEFER_BYTES)
        if raw is not None and not raw.strip():
            return None  # caught between the truncation and the write: the next beat reads it
        seconds = job_files.parse_seconds(raw)
        if seconds is None:
            self._deferral_seen = signature
            logger.warning("the job's deferral request is not a positive number; ignored", extra=self.fields)
            return None
        return Deferral(min(seconds, MAX_DEFER_S), signature)

    def deferral_sent(self, deferral: Deferral) -> None:
        """The server had ``deferral``: it is not sent again."""
        self._deferral_seen = deferral.signature
        logger.info("deferral asked", extra={**self.fields, "defer_s": deferral.seconds})

    # --- the phase's own thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._wait_for_save():
                self._upload()
        except Exception:
            # The attempt's end still uploads; the phase's failure must not touch the job.
            logger.exception("checkpoint phase failed", extra=self.fields)

    def _wait_for_save(self) -> bool:
        """Hint the job, then wait for its done file; True once it is there, False if the phase
        ended first."""
        next_hint = time.monotonic()
        warned = False
        while not self._ended.is_set():
            if not self.hinted.is_set() and time.monotonic() >= next_hint:
                outcome = self._process.hint(HINT_SIGNAL)
                if outcome == "gone":
                    return False
                if outcome == "sent":
                    self.hinted.set()
                    logger.info("checkpoint hint sent (SIGUSR1)", extra=self.fields)
                else:
                    next_hint = time.monotonic() + self._hint_retry_s
                    if not warned:
                        warned = True
                        logger.warning(
                            "no process of the job handles SIGUSR1 (yet): not sent, since it would end "
                            "it; a job with checkpoint auto or manual needs a handler "
                            "(jobkit.on_checkpoint)",
                            extra=self.fields,
                        )
            if self.hinted.is_set() and self._done_file.exists():
                self.saved.set()
                return True
            self._ended.wait(self._poll_s)
        return False

    def _upload(self) -> None:
        if self._ended.is_set():
            return
        logger.info("the job says its checkpoint is saved", extra=self.fields)
        self.uploaded = self._uploads.upload(self.epoch)
        if not self.uploaded and not self._uploads.closed:
            logger.warning(
                "checkpoint not uploaded (nothing in CORRAL_CHECKPOINT_OUT, or the upload failed); "
                "the server's deadline ends the phase",
                extra=self.fields,
            )
