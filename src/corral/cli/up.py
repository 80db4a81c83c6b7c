"""``corral up``: a server and local workers in one command, for a laptop or a single GPU box.

``--workers N --gpus G`` starts N workers offering G fake GPUs each (no NVML, no device): gangs,
drains and preemptions can be tried on one machine without a GPU cluster. Without ``--gpus`` (nor
``CORRAL_GPUS``) on a host where NVML finds no GPU, each worker offers ``DEFAULT_FAKE_GPUS`` fake
GPUs, and ``up`` says so: a laptop's first ``corral submit --gpus 2`` then runs instead of waiting
for ever on a worker of 0 GPUs (``--gpus 0`` asks for none).

Both run as child processes (``python -m corral server|worker``), never imported: the CLI stays a
client of the API, and the children are exactly what an operator would start by hand. They run in
their own process groups so a Ctrl-C in the terminal reaches only ``up``, which then stops them in
order: the worker first (it stops its jobs and reports them while the server still listens), then
the server. A second Ctrl-C kills what is left at once.

The server's settings are the server's own: ``--db``, ``--host`` and ``--port`` are passed on
only when given, so ``CORRAL_DB``, ``CORRAL_HOST``, ``CORRAL_PORT`` (and every other ``CORRAL_*``
the server reads) reach the child through the environment exactly as they would reach
``corral server``. The URL ``up`` polls and prints is resolved the same way (flag, else variable,
else default) by the server's own settings class, so the two cannot disagree.

Steps: 1. refuse if a server already answers at the URL; 2. start the server, logging to
``corral-server.log``; 3. wait for ``/health`` (exit 1 with the log's last lines if the server dies);
4. start the worker (id ``CORRAL_WORKER_ID``, else ``local``), logging to ``corral-worker.log``;
5. wait for a signal or a death.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from corral.cli import exit_codes
from corral.client import DEFAULT_SERVER, ApiError, Client, ServerUnreachable

SERVER_LOG = "corral-server.log"
WORKER_LOG = "corral-worker.log"
WORKER_ID = "local"
#: what a fake GPU of ``--gpus`` says it is
FAKE_GPU_MODEL = "fake"
FAKE_GPU_VRAM_MB = 16384
#: fake GPUs each worker offers when ``--gpus`` is not given and NVML finds none
DEFAULT_FAKE_GPUS = 8
START_TIMEOUT_S = 30.0
WORKER_STOP_TIMEOUT_S = 75.0  # the worker gives running jobs 60 s (CORRAL_SHUTDOWN_TIMEOUT_S) to end
SERVER_STOP_TIMEOUT_S = 15.0
TAIL_LINES = 20
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    del parent  # `up` starts the server; it has no --server to point at
    parser = subcommands.add_parser(
        "up",
        help="start a local server and worker",
        description=(
            f"Start `corral server` and one local `corral worker` (id CORRAL_WORKER_ID, else {WORKER_ID}), "
            "wait until the server answers, then run until Ctrl-C or SIGTERM. Both read their other "
            f"settings from CORRAL_* (see `corral server --help`). Logs go to {SERVER_LOG} and {WORKER_LOG} "
            "in the current directory."
        ),
    )
    # No defaults here: a flag not given must leave the server's CORRAL_* variable in charge.
    parser.add_argument("--db", help="store URL or SQLite file [env CORRAL_DB; default sqlite:///corral.db]")
    parser.add_argument("--host", help="address the server listens on [env CORRAL_HOST; default 127.0.0.1]")
    parser.add_argument(
        "--port", type=_port, help="port the server listens on [env CORRAL_PORT; default 8765]"
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="local workers to start (default 1): with several, gangs, drains and preemptions "
        "play out on one machine",
    )
    parser.add_argument(
        "--gpus",
        type=_non_negative,
        metavar="G",
        help="each worker offers G fake GPUs (no NVML, no real device: a way to try GPU scheduling "
        f"without a GPU); default: the GPUs NVML finds, else {DEFAULT_FAKE_GPUS} fake ones; 0: none",
    )
    parser.set_defaults(run=run)


class _Child:
    """A child process and the log it writes, remembering where this run's lines start."""

    def __init__(self, role: str, arguments: list[str], log_path: Path) -> None:
        self.role = role
        self.log_path = log_path
        self._terminated = False
        self._log: IO[bytes] = log_path.open("ab")
        self._start_offset = self._log.tell()
        self.process = subprocess.Popen(  # noqa: S603 (corral itself, argument list, no shell)
            [sys.executable, "-m", "corral", role, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )

    def died(self) -> bool:
        return self.process.poll() is not None

    def report_death(self) -> None:
        print(
            f"corral: the {self.role} exited with code {self.process.returncode}; "
            f"last lines of {self.log_path}:",
            file=sys.stderr,
        )
        for line in self.tail():
            print(f"  {line}", file=sys.stderr)

    def tail(self) -> list[str]:
        with self.log_path.open("rb") as log:
            log.seek(self._start_offset)
            text = log.read().decode(errors="replace")
        return text.splitlines()[-TAIL_LINES:]

    def terminate(self) -> None:
        """SIGTERM, once (a second one would tell a worker to hurry)."""
        if not self._terminated and not self.died():
            self.process.send_signal(signal.SIGTERM)
        self._terminated = True

    def stop(self, timeout_s: float, hurry: threading.Event) -> None:
        """SIGTERM, then SIGKILL to the whole group after ``timeout_s`` or at a second Ctrl-C."""
        if not self.died():
            self.terminate()
            deadline = time.monotonic() + timeout_s
            while not self.died() and time.monotonic() < deadline and not hurry.is_set():
                time.sleep(0.05)
        if not self.died():
            print(f"corral: killing the {self.role}", file=sys.stderr)
        # Kill leftovers in the group too (jobs the worker could not stop); the group is ours.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


class _Signals:
    """The first signal asks for an orderly stop; a second one asks to hurry (kill)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for number in _STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: object) -> None:
        if self.stop.is_set():
            self.hurry.set()
        else:
            print(
                "\ncorral: stopping (worker, then server); Ctrl-C again to kill", file=sys.stderr, flush=True
            )
        self.stop.set()


def run(arguments: argparse.Namespace) -> int:
    host, port, scheme = _listen_address(arguments)
    if port == 0:
        print(
            "corral: `corral up` needs a fixed port to wait on (CORRAL_PORT=0 asks for any free one); "
            "use --port or set CORRAL_PORT",
            file=sys.stderr,
        )
        return exit_codes.REFUSED
    url = f"{scheme}://{_client_host(host)}:{port}"
    if _answers(url):
        print(f"corral: a server already answers at {url}; stop it or use --port", file=sys.stderr)
        return exit_codes.REFUSED
    signals = _Signals()
    signals.install()
    children: list[_Child] = []
    try:
        server = _Child("server", _server_arguments(arguments), Path(SERVER_LOG).resolve())
        children.append(server)
        if not _wait_until_healthy(url, server, signals.stop):
            if signals.stop.is_set():
                return exit_codes.OK
            if server.died():
                server.report_death()
            else:
                print(
                    f"corral: the server did not answer at {url} within {START_TIMEOUT_S:.0f} s",
                    file=sys.stderr,
                )
            return exit_codes.REFUSED
        gpus = offered_gpus(arguments.gpus)
        for worker_arguments, log in _workers(url, arguments.workers, gpus):
            children.append(_Child("worker", worker_arguments, Path(log).resolve()))
        _announce(url, arguments.workers)
        while not signals.stop.wait(0.2):
            for child in children:
                if child.died():
                    child.report_death()
                    return exit_codes.REFUSED
        return exit_codes.OK
    finally:
        # Every worker is asked at once (each stops its own jobs), then each is waited for; the
        # server last, so the workers' final reports reach it.
        for child in children:
            if child.role == "worker":
                child.terminate()
        for child in reversed(children):
            timeout_s = WORKER_STOP_TIMEOUT_S if child.role == "worker" else SERVER_STOP_TIMEOUT_S
            child.stop(timeout_s, signals.hurry)
        signals.restore()


def offered_gpus(given: int | None, detect: Callable[[], int] | None = None) -> int | None:
    """The ``--gpus`` each worker is started with: ``given``, else none (the worker detects its
    own) where ``CORRAL_GPUS`` is set or NVML finds a GPU, else ``DEFAULT_FAKE_GPUS``, said on
    stdout. ``detect``: how many GPUs NVML finds (the worker's own detection by default)."""
    if given is not None or os.environ.get("CORRAL_GPUS"):
        return given
    if detect is None:
        from corral.worker.resources import detect_gpus

        def detect() -> int:
            return detect_gpus().count

    if detect() > 0:
        return None
    print(
        f"corral: no GPU found through NVML: each local worker offers {DEFAULT_FAKE_GPUS} fake GPUs "
        "(--gpus G for another count, --gpus 0 for none)",
        flush=True,
    )
    return DEFAULT_FAKE_GPUS


def _listen_address(arguments: argparse.Namespace) -> tuple[str, int, str]:
    """The host and port the server will listen on: the flag, else ``CORRAL_*``, else the default;
    and its scheme (``https`` when ``CORRAL_TLS_CERT`` is set).

    Resolved by ``ServerSettings`` itself (imported here, not at the top: the other commands never
    pay for pydantic-settings), so ``up`` waits on exactly the address the child binds. A bad
    variable stops ``up`` with the server's own message naming it.
    """
    from corral.config import ServerSettings, load

    flags = argparse.Namespace(host=arguments.host, port=arguments.port)
    settings: ServerSettings = load(ServerSettings, flags)
    return settings.host, settings.port, "https" if settings.tls_cert else "http"


def _server_arguments(arguments: argparse.Namespace) -> list[str]:
    """Only the flags the user gave: the rest of the server's settings come from its environment."""
    server_arguments = []
    if arguments.db is not None:
        server_arguments += ["--db", _store_url(arguments.db)]
    if arguments.host is not None:
        server_arguments += ["--host", arguments.host]
    if arguments.port is not None:
        server_arguments += ["--port", str(arguments.port)]
    return server_arguments


def _workers(url: str, count: int, gpus: int | None) -> list[tuple[list[str], str]]:
    """Each worker's arguments and log file. One worker keeps the plain names (id ``local``, or
    ``CORRAL_WORKER_ID``; ``corral-worker.log``); several are ``local-1``... with a log each."""
    workers = []
    for number in range(1, count + 1):
        # --server always: the worker serves this server, whatever CORRAL_SERVER says for clients.
        arguments = ["--server", url]
        if count > 1:
            arguments += ["--worker-id", f"{WORKER_ID}-{number}"]
        elif not os.environ.get("CORRAL_WORKER_ID"):
            arguments += ["--worker-id", WORKER_ID]
        if gpus is not None:
            arguments += ["--gpus", str(gpus), "--gpu-sampler", "none"]
            if gpus:
                arguments += ["--gpu-model", FAKE_GPU_MODEL, "--vram-mb", str(FAKE_GPU_VRAM_MB)]
        if not os.environ.get("CORRAL_STATE_DIR"):
            # beside its log: what a killed worker left is found by the next `corral up` here
            arguments += ["--state-dir", str(Path(f".corral-worker-state-{number}").resolve())]
        log = WORKER_LOG if count == 1 else WORKER_LOG.replace(".log", f"-{number}.log")
        workers.append((arguments, log))
    return workers


def _announce(url: str, workers: int = 1) -> None:
    # The hint omits --server only when a bare `corral submit` here would reach this server.
    client_default = os.environ.get("CORRAL_SERVER") or DEFAULT_SERVER
    server_flag = "" if url == client_default.rstrip("/") else f" --server {url}"
    print(f"corral is up: {url}", flush=True)
    print(f"  next: corral submit{server_flag} -- echo hello")
    print(f"        corral jobs{server_flag}")
    worker_logs = WORKER_LOG if workers == 1 else WORKER_LOG.replace(".log", f"-{{1..{workers}}}.log")
    print(f"logs: {SERVER_LOG} and {worker_logs} in {Path.cwd()}; Ctrl-C stops the workers, then the server")
    sys.stdout.flush()


def _wait_until_healthy(url: str, server: _Child, stop: threading.Event) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    with Client(url, timeout_s=2.0) as client:
        while time.monotonic() < deadline and not stop.is_set() and not server.died():
            try:
                client.health()
                return True
            except (ServerUnreachable, ApiError):
                stop.wait(0.1)
    return False


def _answers(url: str) -> bool:
    with Client(url, timeout_s=2.0) as client:
        try:
            client.health()
        except ServerUnreachable:
            return False
        except ApiError:
            return True
    return True


def _store_url(db: str) -> str:
    """A bare path means a SQLite file: ``--db jobs.db`` is ``sqlite:///jobs.db``."""
    return db if "://" in db else f"sqlite:///{db}"


def _client_host(host: str) -> str:
    """Where a local client reaches a server listening on ``host`` (a wildcard means this machine)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 (reading a wildcard, not binding one)
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {port}")
    return port
