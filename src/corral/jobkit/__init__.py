"""What a job imports to talk to the corral worker that runs it. Standard library only.

``beat(step=None)`` reports progress. The worker gives every job ``CORRAL_BEAT_FILE``, a path in
the job's private directory; **any write to that file is a beat**, and an integer in it is the
step, so a shell job beats with::

    echo 42 > "$CORRAL_BEAT_FILE"

The worker sees a beat by the file's modification time and size changing; it reads the content
only to show the last step when a watchdog trips. Why beat at all: the stall watchdog is inert
until a job's first beat (so loading a model is never policed), then suspects a stall when no
beat came for ``stall_timeout_s`` and, if the job's GPUs are idle and its memory static, stops
it and has it re-queued. The GPU-health watchdog also starts a fresh window at each beat. A job
that never beats is never stall-tripped.

``beat`` is cheap enough to call on every training step: it writes at most once a second
(``time.monotonic()`` decides, no system call otherwise) and does nothing outside corral (no
``CORRAL_BEAT_FILE``). Write errors are swallowed: progress reporting must never break a job.

Checkpoints: whatever the job left at ``checkpoint_path()`` (``$CORRAL_CHECKPOINT_OUT``) when its
attempt ends is uploaded by the worker and handed to the job's next attempt, where
``load_checkpoint()`` returns it. Every end counts: an exit of its own (0 or a crash), a crash of
a gang peer that makes this rank's collective fail, a watchdog trip, the worker shutting down, and
a stop the server asked for (its gang lost a member, a preemption, a cancel), where the worker
sends the job's process group SIGTERM, waits ``CORRAL_PREEMPT_GRACE_S`` (15 s by default), then
SIGKILL. So the robust pattern is to save after every step (or every N steps): nothing then
depends on a signal handler getting to run. The bytes are opaque to corral: pickle, ``torch.save``
into a buffer, JSON, anything::

    from corral import jobkit

    state = jobkit.load_checkpoint()          # None on a first run
    step = int(state.decode()) if state else 0
    while step < total:
        train_one_step(); step += 1
        jobkit.save_checkpoint(str(step).encode())

``on_preempt(callback)`` adds a last save when the stop signal comes (state that is too costly to
save at every step). The last checkpoint saved is what is uploaded, even when the job is killed
before its SIGTERM handler finishes. The server keeps at most ``CORRAL_CHECKPOINT_MAX_BYTES``
(16 MiB by default); larger state belongs on shared storage, with its path in the checkpoint.

A gang rank also sees the latest checkpoint of every rank of its gang: ``gang_checkpoint_path(rank)``
is the file in ``$CORRAL_GANG_CHECKPOINT_DIR`` (``rank-<rank>``) or None, and
``load_gang_checkpoint(rank)`` its bytes. That makes the usual "rank 0 saves the model, every rank
loads it" work without shared storage::

    state = jobkit.load_gang_checkpoint(0) or jobkit.load_checkpoint()

A shell job needs none of this: ``echo $step > "$CORRAL_CHECKPOINT_OUT"`` saves, ``cat
"$CORRAL_CHECKPOINT_IN"`` or ``cat "$CORRAL_GANG_CHECKPOINT_DIR/rank-0"`` loads.

Checkpoint on request: a job submitted with ``checkpoint: auto`` or ``manual`` is asked to save
before a preemption stops it. The worker sends the job's process group **SIGUSR1**, waits for the
job to say its save is complete, uploads ``$CORRAL_CHECKPOINT_OUT``, and only then (or once the
server's deadline, ``CORRAL_CHECKPOINT_TIMEOUT_S``, passed) stops it with SIGTERM as above.
``on_checkpoint(callback)`` does the job's part: it runs ``callback()`` on SIGUSR1, saves what the
callback returns when that is bytes, tells the worker "saved", and lets the job run on::

    @jobkit.on_checkpoint
    def save():
        return pickle.dumps(state)     # or call jobkit.save_checkpoint(...) and return None

"Saved" is the creation of the file ``$CORRAL_CHECKPOINT_DONE_FILE`` (the worker removes it
before each request, so any write or ``touch`` counts); whatever
``$CORRAL_CHECKPOINT_OUT`` holds then is uploaded (a job that says "saved" with nothing there
uploads nothing, and the deadline ends the wait). ``defer(seconds)`` asks for more time while a
save is under way (the server grants up to ``CORRAL_MAX_DEFERRAL_S``, 300 s, in all): it writes the
number to ``$CORRAL_DEFER_FILE``, and each write is one request. Outside a checkpoint phase it
changes nothing. A shell job does the same with a trap::

    trap 'echo $step > "$CORRAL_CHECKPOINT_OUT"; touch "$CORRAL_CHECKPOINT_DONE_FILE"' USR1
    echo 120 > "$CORRAL_DEFER_FILE"      # inside the trap, before a long save

(A shell runs a trap once its current command returns; the group's signal ends a plain ``sleep``
child at once, so a loop of short commands answers quickly.)

SIGUSR1's default action ends a process, so a job with ``checkpoint: auto`` or ``manual`` must
handle it. The worker does not send it while the job's main process has no handler (it tries again
every second, so a handler installed after slow imports still gets it), and a process of the group
without one would die of it: a shell script that wraps the program should ``exec`` it (``exec python
train.py``), so that the program is the main process, and the program should install its handler
(``on_checkpoint``) before it starts child processes, which then inherit it. Forked children ignore
the hint; only the process that called ``on_checkpoint`` saves.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

__all__ = [
    "BEAT_INTERVAL_S",
    "PREEMPT_EXIT_CODE",
    "beat",
    "checkpoint_path",
    "defer",
    "gang_checkpoint_path",
    "load_checkpoint",
    "load_gang_checkpoint",
    "on_checkpoint",
    "on_preempt",
    "save_checkpoint",
]

#: The shortest time between two writes of the beat file, in seconds.
BEAT_INTERVAL_S = 1.0
#: The exit status after an ``on_preempt`` callback: 128 + SIGTERM, what a shell reports for a
#: process that SIGTERM ended, so the job's exit reads the same with or without the handler.
PREEMPT_EXIT_CODE = 128 + signal.SIGTERM

_Callback = TypeVar("_Callback", bound=Callable[[], object])
#: The signal with which the worker asks for a checkpoint.
CHECKPOINT_SIGNAL = signal.SIGUSR1

_lock = threading.Lock()
_last_write = -float("inf")
_calls = 0


def beat(step: int | None = None) -> bool:
    """Report progress: write ``step`` (else a count of calls) to ``$CORRAL_BEAT_FILE``.

    Returns True when this call wrote the file, False when it was skipped (rate limit, outside
    corral, or the file could not be written).
    """
    global _calls, _last_write
    path = os.environ.get("CORRAL_BEAT_FILE")
    if not path:
        return False
    now = time.monotonic()
    with _lock:
        _calls += 1
        if now - _last_write < BEAT_INTERVAL_S:
            return False
        _last_write = now
        value = _calls if step is None else step
    try:
        with open(path, "w", encoding="ascii") as beat_file:
            beat_file.write(f"{value}\n")
    except OSError:
        return False
    return True


def _reset() -> None:
    """Forget the rate limit and the count (tests, or a forked child that beats on its own)."""
    global _calls, _last_write
    with _lock:
        _calls = 0
        _last_write = -float("inf")


# --- checkpoints ---------------------------------------------------------------------------


def checkpoint_path() -> str | None:
    """Where this attempt writes its checkpoint (``$CORRAL_CHECKPOINT_OUT``); None outside corral."""
    return os.environ.get("CORRAL_CHECKPOINT_OUT") or None


def load_checkpoint() -> bytes | None:
    """The checkpoint an earlier attempt of this job saved; None on a first run or outside corral.

    Read from the file at ``$CORRAL_CHECKPOINT_IN`` (the worker downloads it before the job starts),
    else decoded from ``$CHECKPOINT_DATA`` (base64, which the server adds for checkpoints up to
    64 KiB), so a job started by hand with only ``CHECKPOINT_DATA`` set resumes too.
    """
    path = os.environ.get("CORRAL_CHECKPOINT_IN")
    if path:
        try:
            with open(path, "rb") as checkpoint:
                return checkpoint.read()
        except OSError:
            pass
    inline = os.environ.get("CHECKPOINT_DATA")
    if inline:
        try:
            return base64.b64decode(inline, validate=True)
        except (binascii.Error, ValueError):
            warnings.warn("CHECKPOINT_DATA is not valid base64; ignored", RuntimeWarning, stacklevel=2)
    return None


def gang_checkpoint_path(rank: int) -> str | None:
    """The file holding gang rank ``rank``'s latest checkpoint (``$CORRAL_GANG_CHECKPOINT_DIR/
    rank-<rank>``, downloaded by the worker before the job started); None when that rank has none,
    outside a gang, or outside corral."""
    directory = os.environ.get("CORRAL_GANG_CHECKPOINT_DIR")
    if not directory:
        return None
    path = os.path.join(directory, f"rank-{int(rank)}")
    return path if os.path.isfile(path) else None


def load_gang_checkpoint(rank: int) -> bytes | None:
    """The bytes of gang rank ``rank``'s latest checkpoint; None when there is none (see
    ``gang_checkpoint_path``)."""
    path = gang_checkpoint_path(rank)
    if path is None:
        return None
    try:
        with open(path, "rb") as checkpoint:
            return checkpoint.read()
    except OSError:
        return None


def save_checkpoint(data: bytes) -> None:
    """Save ``data`` as this attempt's checkpoint, replacing any earlier one; the worker uploads it
    when the attempt ends, however it ends.

    Atomic: the bytes go to a temporary file next to ``$CORRAL_CHECKPOINT_OUT``, renamed over it
    once complete, so a SIGKILL in the middle of a save leaves the previous checkpoint, never a torn
    one. (No fsync: the file only has to outlive the process, not the host, and a fsync of a large
    checkpoint could eat the grace period.) Outside corral it does nothing but warn.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"a checkpoint is bytes, not {type(data).__name__}")
    path = checkpoint_path()
    if path is None:
        warnings.warn(
            "save_checkpoint outside corral (no CORRAL_CHECKPOINT_OUT); nothing saved",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    directory, name = os.path.split(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as checkpoint:
            checkpoint.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def on_preempt(callback: _Callback) -> _Callback:
    """Run ``callback()`` when the worker sends the stop signal, then exit with status 143.

    SIGTERM is the stop signal the worker sends when the job must stop (its gang lost a member, a
    preemption, a cancel): save your checkpoint there, with ``save_checkpoint``. The callback runs
    once (a second SIGTERM during it is ignored) and must finish within the grace period
    (``CORRAL_PREEMPT_GRACE_S``), after which the worker sends SIGKILL. The process then exits with
    ``os._exit(143)`` after flushing stdout and stderr: at once, even with non-daemon threads or
    an ``except BaseException`` around the interrupted code, which a ``SystemExit`` would not get
    past. An exception in the callback is printed and the exit is the same.

    The worker signals the job's whole process group, so forked children (data-loader workers)
    inherit this handler: in them it does not call ``callback`` but dies of SIGTERM as they would
    have without it. Call from the main thread (Python only installs signal handlers there).
    Returns ``callback``, so it also works as a decorator.
    """
    installer = os.getpid()
    fired = False

    def handle(signal_number: int, frame: FrameType | None) -> None:
        nonlocal fired
        if os.getpid() != installer:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if fired:
            return
        fired = True
        try:
            callback()
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    stream.flush()
            os._exit(PREEMPT_EXIT_CODE)

    signal.signal(signal.SIGTERM, handle)
    return callback


# --- checkpoint on request -----------------------------------------------------------------


def on_checkpoint(callback: _Callback) -> _Callback:
    """Run ``callback()`` when the worker asks for a checkpoint (SIGUSR1), then tell it "saved".

    The callback saves the job's state: with ``save_checkpoint(data)``, or by returning the bytes,
    which are then saved for it. Afterwards the file ``$CORRAL_CHECKPOINT_DONE_FILE`` is created,
    which tells the worker to upload the checkpoint; the job keeps running until the stop comes
    (SIGTERM, see ``on_preempt``). A callback that raises is printed and "saved" is still said: the
    last checkpoint saved (if any) is the best there is, and waiting out the deadline would help
    nobody. A SIGUSR1 during the callback is ignored; a later one runs it again (a new request).
    The hint counts as a beat for a job that beats (``beat``), so the stall watchdog gives the save
    a whole ``stall_timeout_s``; a save that takes longer should ``beat`` as it goes.

    Forked children (data-loader workers) inherit the handler; in them it does nothing, so the hint
    neither kills them nor makes them save. Call from the main thread (Python only installs signal
    handlers there; elsewhere ``signal.signal`` raises ``ValueError``). Returns ``callback``, so it
    also works as a decorator.
    """
    installer = os.getpid()
    running = False

    def handle(signal_number: int, frame: FrameType | None) -> None:
        nonlocal running
        if os.getpid() != installer or running:
            return
        running = True
        try:
            _refresh_beat()
            try:
                data = callback()
                if isinstance(data, (bytes, bytearray, memoryview)):
                    save_checkpoint(bytes(data))
            except BaseException:
                traceback.print_exc()
            _say_saved()
        finally:
            running = False

    signal.signal(CHECKPOINT_SIGNAL, handle)
    return callback


def _refresh_beat() -> None:
    """Count the save as progress: the stall watchdog, once armed, then gives it a whole
    ``stall_timeout_s`` window. A job that never beat keeps its watchdog inert (no file: no beat)."""
    path = os.environ.get("CORRAL_BEAT_FILE")
    if path:
        with contextlib.suppress(OSError):
            os.utime(path)


def _say_saved() -> bool:
    """Create ``$CORRAL_CHECKPOINT_DONE_FILE``: the save the worker asked for is complete."""
    path = os.environ.get("CORRAL_CHECKPOINT_DONE_FILE")
    if not path:
        return False
    try:
        with open(path, "w", encoding="ascii") as done:
            done.write("saved\n")
    except OSError:
        return False
    return True


def defer(seconds: float) -> bool:
    """Ask for ``seconds`` more before the stop, while a checkpoint's save is under way.

    Writes the number to ``$CORRAL_DEFER_FILE``; the worker forwards each write once with the
    job's next heartbeat (every ``CORRAL_HEARTBEAT_S``), and the server grants deferrals up to
    ``CORRAL_MAX_DEFERRAL_S`` (300 s) in all. Outside a checkpoint phase the worker ignores it.
    True when the request was written; False outside corral, for a number that is not positive
    and finite, or when the file cannot be written. Never raises.
    """
    path = os.environ.get("CORRAL_DEFER_FILE")
    try:
        amount = float(seconds)
    except (TypeError, ValueError):
        return False
    if not path or not amount > 0 or amount == float("inf"):
        return False
    try:
        with open(path, "w", encoding="ascii") as request:
            request.write(f"{amount:g}\n")
    except OSError:
        return False
    return True
