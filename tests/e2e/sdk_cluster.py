"""A small real cluster for the SDK's tests: one ``corral server`` process (fast admission, so a
gang starts within a fraction of a second) and two ``corral worker`` processes, ``w1`` and ``w2``,
of 4 CPUs and no GPU each (a gang of 2 takes one task on each).

The SDK's tests share one cluster per module (``tests/e2e/test_sdk.py``,
``tests/e2e/test_sdk_examples.py``): starting three processes costs seconds, each test uses its own
jobs, and what one leaves behind (a job no worker could hold, waiting for ever) is no worry to the next.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from corral.client import Client, ServerUnreachable
from tests.e2e.conftest import FAST_SERVER_FLAGS, FAST_WORKER_FLAGS, clean_environment, free_port, wait_for

WORKERS = ("w1", "w2")


def _stop(process: subprocess.Popen[bytes], signals: tuple[int, ...]) -> None:
    for signal_number in signals:
        if process.poll() is None:
            process.send_signal(signal_number)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _answers(client: Client) -> bool:
    try:
        client.health()
    except ServerUnreachable:
        return False
    return True


@contextlib.contextmanager
def running_cluster(directory: Path) -> Iterator[str]:
    """Start the server and both workers in ``directory``; its URL once both workers registered.
    Everything started is stopped on the way out (workers first, SIGTERM twice: they stop their
    jobs), whatever happened inside."""
    processes: list[tuple[subprocess.Popen[bytes], tuple[int, ...]]] = []
    url = f"http://127.0.0.1:{free_port()}"
    port = url.rsplit(":", 1)[1]
    try:
        with (directory / "server.log").open("wb") as log:
            command = [sys.executable, "-m", "corral", "server", "--db", f"sqlite:///{directory}/corral.db"]
            server = subprocess.Popen(
                [*command, "--port", port, *FAST_SERVER_FLAGS],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=clean_environment(),
                cwd=directory,
            )
        processes.append((server, (signal.SIGTERM,)))
        with Client(url, timeout_s=10.0) as client:
            wait_for(lambda: _answers(client), 20, "the server to answer")
            for worker_id in WORKERS:
                with (directory / f"worker-{worker_id}.log").open("wb") as log:
                    command = [
                        sys.executable,
                        "-m",
                        "corral",
                        "worker",
                        "--server",
                        url,
                        "--worker-id",
                        worker_id,
                    ]
                    worker = subprocess.Popen(
                        [*command, *FAST_WORKER_FLAGS, "--state-dir", str(directory / f"state-{worker_id}")],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=clean_environment(),
                        cwd=directory,
                    )
                processes.insert(0, (worker, (signal.SIGTERM, signal.SIGTERM)))
            wait_for(lambda: len(client.workers()) == len(WORKERS), 20, "both workers to register")
        yield url
    finally:
        for process, signals in processes:
            _stop(process, signals)
