"""Work that runs long in Python, done in a process of its own: the admission pass and the large
list answers.

The server's event loop shares the interpreter lock with its threads. A thread in a long stretch of
Python (an admission pass over 2,000 hosts, a page of 5,000 jobs) makes every request the loop
serves meanwhile wait for the lock again at each statement and each socket call: at 2,000 hosts
heartbeat p99 went from ~7 ms to a large part of the pass or the list (``bench/fleet.py``). A
``StoreProcess`` is a child with its own store connection that runs such work, a module-level
function of ``(store, memory, *args)`` named by the server (``call``), and sends back its result:
a value (a ``PassPlan``) or the bytes of an answer. ``memory`` is the child's own dict, kept from
call to call (the admission pass keeps its records and ``CycleMemo`` there, as the server would).

The child is started at the first call (the writer at the server's start: ``start``) and again
after it died or was stopped for not answering within its timeout (the call that found it dead
mid-work, or waited past the timeout, raises ``OffloadGone``; one found dead before is replaced
first); it ends when the server closes it, or when its input closes (the server died). Messages
are length-prefixed pickles on the child's stdin and its stdout (its own writes to stdout go to
stderr instead). Only ``corral server`` runs them (``CORRAL_STORE_PROCESSES``); a server made in
a test does this work on its threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from corral.domain import errors

logger = logging.getLogger("corral.server.offload")

T = TypeVar("T")

_LENGTH = struct.Struct("!Q")


class OffloadGone(Exception):
    """The child ended or its pipe broke (or the server is stopping); the next call starts a new one."""


@dataclass(frozen=True)
class StoreProcessConfig:
    """What the child needs to open the store as the server does."""

    store_url: str
    busy_timeout_s: float
    log_level: str
    #: the server's ``CORRAL_GC_THRESHOLD`` (``collector``): a batch of 10,000 jobs in the writer
    #: allocates as a busy server does (0: the interpreter's 700, ~1.3x the CPU on such a batch)
    gc_threshold: int = 0


def send(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    """The next message, or EOFError when the other end closed."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the pipe closed")
    (length,) = _LENGTH.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)  # noqa: S301 (our own child process, over its own pipes)


class StoreProcess:
    """The server's side: ``call`` sends one piece of work and waits for its result (one at a
    time: a second caller waits for the first), at most ``timeout_s``: a child that has not
    answered by then is stopped (``OffloadGone``), as if it had died, so that a stuck one (a bug, a
    database connection that neither answers nor fails) cannot hold its callers for ever (the
    admission loop's passes, every later batch submit)."""

    def __init__(self, config: StoreProcessConfig, name: str, timeout_s: float | None = None) -> None:
        self._config = config
        self.name = name
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: the child stopped because its call ran past ``timeout_s`` (read once that call ends)
        self._timed_out = False

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(store, memory, *args)`` in the child: its result, or what it raised, or
        ``OffloadGone``. ``function`` is pickled by name: a module-level function of corral."""
        with self._lock:
            if self._closed:  # the server is stopping: work still in flight starts no new child
                raise OffloadGone(f"the {self.name} process is closed: the server is stopping")
            self._timed_out = False  # this call's own: a late deadline of the last one left nothing
            try:
                process = self._running()
                assert process.stdin is not None and process.stdout is not None
                send(process.stdin, (function, args))
                outcome = self._answer(process, function)
            except (EOFError, OSError) as error:
                if self._process is not None:
                    self._stop(self._process)
                if self._timed_out:
                    raise OffloadGone(
                        f"the {self.name} process did not answer within {self.timeout_s:g}s and was"
                        " stopped; a new one takes the next call"
                    ) from error
                raise OffloadGone(
                    f"the {self.name} process ended ({error}); a new one takes the next call"
                ) from error
        if isinstance(outcome, _Raised):
            raise outcome.error
        result: T = outcome
        return result

    def _answer(self, process: subprocess.Popen[bytes], function: Callable[..., Any]) -> Any:
        """The child's answer to the call just sent; past ``timeout_s`` the child is killed, which
        ends the read (``EOFError``). An answer read just as the deadline passed is kept, and the
        child, killed or about to be, is stopped here, so that the next call starts a new one
        rather than writing to a dead child (a batch never sent answered 503)."""
        assert process.stdout is not None
        if self.timeout_s is None:
            return receive(process.stdout)
        deadline = _Deadline()
        timer = threading.Timer(self.timeout_s, self._kill_stuck, (process, function, deadline))
        timer.daemon = True
        timer.start()
        try:
            outcome = receive(process.stdout)
        finally:
            timer.cancel()
        if not deadline.answered():
            self._stop(process)
        return outcome

    def _kill_stuck(
        self, process: subprocess.Popen[bytes], function: Callable[..., Any], deadline: _Deadline
    ) -> None:
        if not deadline.expire():
            return  # answered meanwhile
        self._timed_out = True
        logger.error(
            "store process did not answer in time; stopping it",
            extra={
                "helper": self.name,
                "pid": process.pid,
                "timeout_s": self.timeout_s,
                "work": getattr(function, "__name__", repr(function)),
            },
        )
        with contextlib.suppress(OSError):
            process.kill()

    def start(self, warm_up: Callable[..., object] | None = None) -> None:
        """Start the child now rather than at the first call, which would otherwise wait for its
        interpreter and imports (~1 s, 3 s on a loaded host: the first batch submit after a server
        starts), and run ``warm_up(store, memory)`` there, if given, for what the first call would
        pay on its own (its module's imports, first reads). Nothing once closed; a child that cannot
        start or a warm-up that fails is logged, and the first call starts or pays it again."""
        try:
            with self._lock:
                if self._closed:
                    return
                self._running()
        except OSError:
            logger.exception("store process did not start", extra={"helper": self.name})
            return
        if warm_up is None:
            return
        try:
            self.call(warm_up)
        except OffloadGone as gone:  # closed meanwhile (the server stopping), or ended: told there
            logger.warning("store process warm-up not run", extra={"helper": self.name, "error": str(gone)})
        except Exception:  # only a head start: whatever failed, the first call meets it again
            logger.exception("store process warm-up failed", extra={"helper": self.name})

    def _running(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is not None and process.poll() is not None:
            logger.warning(
                "store process ended; starting another",
                extra={"helper": self.name, "exit_code": process.returncode},
            )
            self._stop(process)
        if process is None or process.poll() is not None:
            process = self._process = subprocess.Popen(  # noqa: S603 (this interpreter, a module of corral)
                [sys.executable, "-m", "corral.server.offload", self.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert process.stdin is not None
            send(process.stdin, self._config)
            logger.info("store process started", extra={"helper": self.name, "pid": process.pid})
        return process

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._process is process:
            self._process = None

    def close(self) -> None:
        """End the child: its input closes, it returns from its loop and closes its store."""
        with self._lock:
            self._closed = True
            if self._process is not None:
                self._stop(self._process)


class _Deadline:
    """One call's deadline: its answer or its expiry, whichever comes first, decides (the timer's
    thread and the caller's may both get there at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decided: str | None = None

    def _decide(self, outcome: str) -> bool:
        with self._lock:
            if self._decided is None:
                self._decided = outcome
            return self._decided == outcome

    def answered(self) -> bool:
        """The answer came first (False: the child is being killed)."""
        return self._decide("answered")

    def expire(self) -> bool:
        """The deadline came first: the child is to be killed."""
        return self._decide("expired")


@dataclass(frozen=True)
class _Raised:
    """What the work raised, sent back as such (an exception is also a possible result)."""

    error: Exception


def serve(requests: IO[bytes], answers: IO[bytes], helper: str = "store process") -> None:
    """The child's loop: a ``StoreProcessConfig``, then one result per request until the input
    closes. ``helper``: its name in its log lines (``planner``, ``reader``, ``writer``)."""
    from corral.observability.logging import configure_logging
    from corral.server import collector
    from corral.store import open_store

    config: StoreProcessConfig = receive(requests)
    configure_logging(config.log_level)
    collector.set_first_threshold(config.gc_threshold)
    store = open_store(config.store_url, migrate=False, busy_timeout_s=config.busy_timeout_s)
    memory: dict[str, Any] = {}
    try:
        while True:
            try:
                function, args = receive(requests)
            except EOFError:
                return
            try:
                outcome: object = function(store, memory, *args)
            except Exception as error:
                if not isinstance(error, errors.CorralError):
                    # the server re-raises it with its own traceback only (a traceback does not
                    # pickle): where in the work it was raised is told here, or never
                    logger.error(
                        "store process work raised",
                        exc_info=error,
                        extra={"helper": helper, "work": getattr(function, "__name__", repr(function))},
                    )
                outcome = _Raised(_sendable(error))
            send(answers, outcome)
    finally:
        store.close()


def _sendable(error: Exception) -> Exception:
    """The error itself where it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301 (a round trip of our own object)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the server stops the child itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not break a message
    serve(sys.stdin.buffer, answers, sys.argv[1] if len(sys.argv) > 1 else "store process")


if __name__ == "__main__":
    # Run as the module's own name, not ``__main__``, so what it sends back pickles by that name.
    from corral.server import offload

    offload.main()
