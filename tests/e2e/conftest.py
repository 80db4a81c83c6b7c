"""End-to-end fixtures: a real ``corral server`` and real ``corral worker`` processes.

Each test starts what it needs through the factories below; every process they start is stopped
in teardown (workers get SIGTERM twice so they stop their jobs, then SIGKILL if they linger), and
every process group a test registers with ``reap_groups`` is killed, so nothing outlives a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from corral.client import Client
from corral.worker import cgroups

T = TypeVar("T")

# Small intervals so every test finishes in seconds.
FAST_WORKER_FLAGS = [
    "--heartbeat-s", "0.2",
    "--worker-heartbeat-s", "0.5",
    "--preempt-grace-s", "0.5",
    "--poll-s", "0.2",
    "--claim-wait-s", "1",
    "--shutdown-timeout-s", "5",
    "--cpus", "4",
    "--memory-mb", "4096",
]  # fmt: skip
_START_TIMEOUT_S = 15.0


def wait_for(check: Callable[[], T | None], timeout_s: float = 10.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def clean_environment() -> dict[str, str]:
    """The test's environment without ``CORRAL_*`` settings that would leak into the processes."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CORRAL_")}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path


@dataclass
class WorkerProcess:
    worker_id: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _log_file: Any = field(repr=False, default=None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signal_number: int) -> None:
        self.process.send_signal(signal_number)


def _read_listen_line(process: subprocess.Popen[bytes]) -> str:
    """The server's one stdout line, read in a thread so a server that never prints cannot hang us."""
    lines: list[bytes] = []
    stdout = process.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(_START_TIMEOUT_S)
    if not lines or not lines[0]:
        raise RuntimeError(f"corral server did not start (exit code {process.poll()})")
    line = lines[0].decode().strip()
    prefix = "corral server listening on "
    assert line.startswith(prefix), line
    return line[len(prefix) :].split()[0]


def _healthy(url: str, ca_file: Path | None = None) -> bool:
    verify = ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else True
    try:
        return httpx.get(f"{url}/healthz", timeout=2, verify=verify).status_code == 200
    except httpx.TransportError:
        return False


def _stop(process: subprocess.Popen[Any], signals: tuple[int, ...], wait_s: float) -> None:
    for signal_number in signals:
        if process.poll() is not None:
            break
        process.send_signal(signal_number)
        time.sleep(0.05)
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start ``corral server`` on a fresh SQLite file; extra flags as arguments. ``ca_file``: the
    CA that signed the certificate of a server started with ``--tls-cert``. The URL of a server
    that listens on every address (``--host 0.0.0.0``) is its loopback one."""
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(*flags: str, port: int = 0, ca_file: Path | None = None) -> ServerProcess:
        index = len(started)
        log_path = tmp_path / f"server-{index}.log"
        log_file = log_path.open("wb")
        command = [sys.executable, "-m", "corral", "server", "--db", f"sqlite:///{tmp_path}/c{index}.db"]
        command += ["--port", str(port), *flags]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log_file, env=clean_environment(), cwd=tmp_path
        )
        started.append((process, log_file))
        url = _read_listen_line(process).replace("://0.0.0.0:", "://127.0.0.1:")
        server = ServerProcess(process, url, log_path)
        wait_for(lambda: _healthy(server.url, ca_file), _START_TIMEOUT_S, "the server to answer /healthz")
        return server

    yield start
    for process, log_file in started:
        _stop(process, (signal.SIGTERM,), 10)
        if process.stdout is not None:
            process.stdout.close()
        log_file.close()


@pytest.fixture
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    return start_server()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``corral worker`` with fast intervals; later flags override the defaults."""
    started: list[WorkerProcess] = []

    def start(
        server_url: str, worker_id: str, *flags: str, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        log_path = tmp_path / f"worker-{worker_id}.log"
        log_file = log_path.open("wb")
        command = [sys.executable, "-m", "corral", "worker", "--server", server_url, "--worker-id", worker_id]
        command += [*FAST_WORKER_FLAGS, "--state-dir", str(tmp_path / f"state-{worker_id}"), *flags]
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**clean_environment(), **(env or {})},
            cwd=tmp_path,
        )
        worker = WorkerProcess(worker_id, process, log_path, log_file)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.returncode is None:
            worker.process.send_signal(signal.SIGCONT)
        _stop(worker.process, (signal.SIGTERM, signal.SIGTERM), 10)
        worker._log_file.close()
        _remove_cgroups(worker.worker_id, tmp_path / f"state-{worker.worker_id}")


def _remove_cgroups(worker_id: str, state_dir: Path) -> None:
    """What a worker the test killed left of its cgroups (a worker that exits removes its own)."""
    containment, _ = cgroups.detect(cgroups.subtree_name(worker_id, state_dir))
    if containment is not None:
        with contextlib.suppress(OSError):
            containment.start()
            containment.shutdown()


@pytest.fixture
def reap_groups() -> Iterator[list[int]]:
    """Process-group ids a test registers (jobs orphaned by a killed worker); killed in teardown."""
    groups: list[int] = []
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as opened:
        yield opened


def wait_status(client: Client, job_id: str, statuses: set[str], timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the job until its status is one of ``statuses``; the job object."""

    def check() -> dict[str, Any] | None:
        job = client.get_job(job_id)
        return job if job["status"] in statuses else None

    return wait_for(check, timeout_s, f"job {job_id} to reach {sorted(statuses)}")


# --- TLS -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """For ``corral server --tls-cert certificate --tls-key key``; clients trust ``ca``."""

    ca: Path
    certificate: Path
    key: Path
    other_ca: Path


def _openssl(*arguments: str, cwd: Path) -> None:
    subprocess.run(["openssl", *arguments], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str) -> None:
    """A self-signed CA: ``name.pem`` and its key ``name.key`` in ``directory``."""
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=corral {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A test CA, a server certificate it signs for 127.0.0.1 and localhost (what a server started
    here is reached at), and a second CA that signed nothing of the server's; made with the
    ``openssl`` command."""
    directory = tmp_path_factory.mktemp("tls")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=corral test server",
        cwd=directory,
    )  # fmt: skip
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    return Certificates(
        directory / "ca.pem", directory / "server.pem", directory / "server.key", directory / "other-ca.pem"
    )


# --- gangs -----------------------------------------------------------------------------------

FAST_SERVER_FLAGS = ("--admission-tick-s", "0.2", "--reaper-tick-s", "0.2")


def gang_cluster(
    start_server: Callable[..., ServerProcess],
    start_worker: Callable[..., WorkerProcess],
    *worker_flags: str,
) -> tuple[ServerProcess, list[WorkerProcess]]:
    server = start_server(*FAST_SERVER_FLAGS)
    workers = [start_worker(server.url, f"w{index}", *worker_flags) for index in range(2)]
    return server, workers


def submit_gang(client: Client, command: str, **fields: Any) -> list[str]:
    submitted = client.submit_body({"command": command, "gang_size": 2, "max_retries": 3, **fields})
    tasks: list[str] = submitted["tasks"]
    return tasks


def wait_gang(client: Client, task_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the task's gang until it is done or failed; the gang."""
    gang_id = client.get_job(task_id)["gang_id"]

    def ended() -> dict[str, Any] | None:
        gang = client.gang(gang_id)
        return gang if gang["status"] in ("done", "failed", "cancelled") else None

    return wait_for(ended, timeout_s, f"gang {gang_id} to end")


def log_records(workers: list[WorkerProcess], message: str) -> list[dict[str, Any]]:
    """The workers' JSON log lines that say ``message``."""
    records = []
    for worker in workers:
        for line in worker.log().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("message") == message:
                    records.append(record)
    return records
