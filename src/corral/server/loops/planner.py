"""The admission pass planned in a process of its own.

The pass reads a snapshot of every worker, allocation and waiting job and runs the core over it:
hundreds of milliseconds of Python at 2,000 hosts. On a thread of the server it shares the
interpreter lock with the event loop, and every request the loop serves meanwhile waits for the
lock at each statement and each socket call: heartbeat p99 went from ~10 ms to a large part of the
pass (``bench/fleet.py``). Here the server sends the child the pass's instant and the per-worker
backoff, the child reads the snapshot through its own store connection and plans
(``admission.plan_pass``, the same code a pass on a thread runs; its records and ``CycleMemo`` are
kept from pass to pass as they would be in the server), and sends back the ``PassPlan``, which the
server applies as before (``admission.apply_pass``). The child writes only the fair-share timers.

The child is started at the first pass and again after it died (the pass that found it dead fails
and is logged, as any failing pass); it ends when the server closes it, or when its input closes
(the server died). Messages are length-prefixed pickles on the child's stdin and its stdout (its
own writes to stdout go to stderr instead). Only ``corral server`` runs one
(``CORRAL_ADMISSION_PROCESS``); a server made in a test plans on its loop thread.
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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from corral.core.placement import CycleMemo
from corral.server.loops.admission import PassPlan, PlanSettings, plan_pass

logger = logging.getLogger("corral.server.planner")

_LENGTH = struct.Struct("!Q")


class PlannerGone(Exception):
    """The planner process ended or its pipe broke; the next pass starts a new one."""


@dataclass(frozen=True)
class PlannerConfig:
    """What the child needs to open the store and plan as the server would."""

    store_url: str
    busy_timeout_s: float
    log_level: str
    settings: PlanSettings


def send(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    """The next message, or EOFError when the other end closed."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the planner pipe closed")
    (length,) = _LENGTH.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the planner pipe closed mid-message")
    return pickle.loads(data)  # noqa: S301 (our own child process, over its own pipes)


class PlannerProcess:
    """The server's side: ``plan`` sends one pass's request and waits for its plan."""

    def __init__(self, config: PlannerConfig) -> None:
        self._config = config
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def plan(self, now: float, last_preemptive: Mapping[str, float]) -> PassPlan:
        """The plan of a pass at ``now``; raises what the child's pass raised, or ``PlannerGone``."""
        with self._lock:
            if self._closed:  # the server is stopping: a pass still in flight starts no new child
                raise PlannerGone("the server is stopping")
            process = self._running()
            assert process.stdin is not None and process.stdout is not None
            try:
                send(process.stdin, (now, dict(last_preemptive)))
                outcome = receive(process.stdout)
            except (EOFError, OSError) as error:
                self._stop(process)
                raise PlannerGone(
                    f"the planner process ended ({error}); a new one plans the next pass"
                ) from error
        if isinstance(outcome, BaseException):
            raise outcome
        plan: PassPlan = outcome
        return plan

    def _running(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is not None and process.poll() is not None:
            logger.warning("planner process ended; starting another", extra={"exit_code": process.returncode})
            self._stop(process)
        if process is None or process.poll() is not None:
            process = self._process = subprocess.Popen(
                [sys.executable, "-m", "corral.server.loops.planner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert process.stdin is not None
            send(process.stdin, self._config)
            logger.info("planner process started", extra={"pid": process.pid})
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


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's loop: a ``PlannerConfig``, then one plan per request until the input closes."""
    from corral.observability.logging import configure_logging
    from corral.store import open_store

    config: PlannerConfig = receive(requests)
    configure_logging(config.log_level)
    store = open_store(config.store_url, migrate=False, busy_timeout_s=config.busy_timeout_s)
    memo = CycleMemo()
    try:
        while True:
            try:
                now, last_preemptive = receive(requests)
            except EOFError:
                return
            try:
                outcome: object = plan_pass(store, config.settings, memo, last_preemptive, now)
            except Exception as error:
                outcome = _sendable(error)
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
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
