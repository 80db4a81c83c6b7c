"""``corral up`` as a user runs it: real processes in a scratch directory, driven by the real CLI.

The full story (up -> submit -> done -> SIGTERM -> nothing left running) needs ``corral worker``;
the failure paths (server dies at start, port already served) need only the server.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import orjson
import psutil
import pytest

from tests.e2e.conftest import Certificates

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 30.0


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _other_loopback_host() -> str:
    """A loopback address other than the default 127.0.0.1 where the OS has one (Linux: all of
    127/8), so a server that ignored ``CORRAL_HOST`` would not answer there; else 127.0.0.1."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.2", 0))
        except OSError:
            return "127.0.0.1"
    return "127.0.0.2"


def _environment() -> dict[str, str]:
    """The test's environment without ``CORRAL_*`` settings, so only the flags given apply."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CORRAL_")}


def _corral(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *argv],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=30,
    )


class _Up:
    """``corral up`` in the background, its stdout read line by line on a thread."""

    def __init__(self, cwd: Path, *argv: str, settings: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "corral", "up", *argv],
            cwd=cwd,
            env={**_environment(), **(settings or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def wait_for_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line
        stderr = self.process.stderr.read() if self.process.poll() is not None and self.process.stderr else ""
        pytest.fail(f"`corral up` printed no {prefix!r} line (exit code {self.process.poll()}): {stderr}")

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def kill_everything(self) -> None:
        """Cleanup after a failed test: only this test's processes, by id."""
        if self.process.poll() is None:
            for child in self.descendants():
                child.kill()
            self.process.kill()
        self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _worker_is_written() -> bool:
    import importlib.util

    return importlib.util.find_spec("corral.worker.main") is not None


@pytest.mark.timeout(150)
@pytest.mark.skipif(not _worker_is_written(), reason="corral worker (corral.worker.main) is not written yet")
def test_up_runs_a_job_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    up = _Up(tmp_path, "--port", str(port))
    try:
        assert up.wait_for_line("corral is up", START_TIMEOUT_S) == f"corral is up: {url}"

        submitted = _corral("submit", "--server", url, "--", "echo", "hello", cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        deadline = time.monotonic() + 60
        status = None
        while status != "done" and time.monotonic() < deadline:
            listed = _corral("jobs", "--all", "--server", url, "--json", cwd=tmp_path)
            assert listed.returncode == 0, listed.stderr
            status = {job["id"]: job["status"] for job in orjson.loads(listed.stdout)["items"]}[job_id]
            assert status not in ("failed", "cancelled")
            time.sleep(0.3)
        assert status == "done"

        children = up.descendants()
        assert len(children) >= 2  # the server and the worker
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(timeout=90) == 0
        for child in children:
            psutil.wait_procs([child], timeout=5)
            assert _gone(child), f"left running: {child.pid} {child.cmdline()}"
        assert (tmp_path / "corral.db").exists()
        assert (tmp_path / "corral-server.log").exists() and (tmp_path / "corral-worker.log").exists()
    finally:
        up.kill_everything()


@pytest.mark.timeout(60)
def test_up_exits_1_with_the_server_log_when_the_server_dies(tmp_path: Path) -> None:
    dead_postgres = f"postgresql://nobody@127.0.0.1:{_free_port()}/none"
    up = _Up(tmp_path, "--port", str(_free_port()), "--db", dead_postgres)
    try:
        assert up.process.wait(timeout=45) == 1
        assert up.process.stderr is not None
        stderr = up.process.stderr.read()
        assert "the server exited with code" in stderr and "corral-server.log" in stderr
        assert "corral server:" in stderr  # the server's own last line, copied from its log
        assert "Traceback" not in stderr.split("last lines")[0]
        assert not (tmp_path / "corral-worker.log").exists()
    finally:
        up.kill_everything()


@pytest.mark.timeout(60)
def test_up_refuses_a_port_another_server_answers(tmp_path: Path) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "corral", "server", "--port", str(port), "--db", "sqlite:///other.db"],
        cwd=tmp_path,
        env=_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _corral("jobs", "--server", f"http://127.0.0.1:{port}", cwd=tmp_path).returncode != 0:
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.2)
        refused = subprocess.run(
            [sys.executable, "-m", "corral", "up", "--port", str(port)],
            cwd=tmp_path,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert refused.returncode == 1
        assert "already answers" in refused.stderr
        assert not (tmp_path / "corral.db").exists()
    finally:
        server.terminate()
        server.wait(timeout=15)


@pytest.mark.timeout(150)
def test_up_serves_where_the_corral_variables_say(tmp_path: Path) -> None:
    host = _other_loopback_host()
    port = _free_port(host)
    url = f"http://{host}:{port}"
    database = tmp_path / "from-environment.db"
    settings = {"CORRAL_HOST": host, "CORRAL_PORT": str(port), "CORRAL_DB": f"sqlite:///{database}"}
    up = _Up(tmp_path, settings=settings)
    try:
        assert up.wait_for_line("corral is up", START_TIMEOUT_S) == f"corral is up: {url}"

        submitted = _corral("submit", "--server", url, "--name", "where", "--", "true", cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        with contextlib.closing(sqlite3.connect(database)) as connection:
            stored = connection.execute("SELECT name FROM jobs WHERE id = ?", (job_id,)).fetchall()
        assert stored == [("where",)]
        assert not (tmp_path / "corral.db").exists()  # the default store was never opened

        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(timeout=90) == 0
    finally:
        up.kill_everything()


@pytest.mark.timeout(150)
def test_up_serves_https_with_the_tls_variables_and_its_worker_reaches_it(
    tmp_path: Path, certificates: Certificates
) -> None:
    port = _free_port()
    url = f"https://127.0.0.1:{port}"
    tls = {
        "CORRAL_TLS_CERT": str(certificates.certificate),
        "CORRAL_TLS_KEY": str(certificates.key),
        "CORRAL_CA_FILE": str(certificates.ca),
    }
    up = _Up(tmp_path, "--port", str(port), settings=tls)
    try:
        assert up.wait_for_line("corral is up", START_TIMEOUT_S) == f"corral is up: {url}"
        submitted = subprocess.run(
            [sys.executable, "-m", "corral", "submit", "--server", url, "--wait", "--", "true"],
            cwd=tmp_path,
            env={**_environment(), "CORRAL_CA_FILE": str(certificates.ca)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.strip().endswith(": done")

        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(timeout=90) == 0
    finally:
        up.kill_everything()


def test_up_refuses_corral_port_0_as_it_could_not_wait_on_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CORRAL_PORT", "0")
    assert main(["up"]) == 1
    assert "needs a fixed port" in capsys.readouterr().err
    assert not (tmp_path / "corral-server.log").exists()  # nothing was started


@pytest.mark.timeout(150)
def test_up_with_several_workers_of_fake_gpus_runs_a_gang(tmp_path: Path) -> None:
    from corral.client import Client

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    up = _Up(tmp_path, "--port", str(port), "--workers", "2", "--gpus", "2")
    try:
        up.wait_for_line("corral is up", START_TIMEOUT_S)
        with Client(url) as client:
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(client.workers()) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            workers = sorted(client.workers(), key=lambda worker: worker.id)
            assert [worker.id for worker in workers] == ["local-1", "local-2"]
            assert {(worker.resources.gpus, worker.gpu_model) for worker in workers} == {(2, "fake")}
            gang = client.submit_body(
                {
                    "command": 'echo "rank $RANK sees $CUDA_VISIBLE_DEVICES"',
                    "gang_size": 2,
                    "resources": {"gpus": 2},
                }
            )
            deadline = time.monotonic() + 60
            while client.gang(gang["gang_id"]).status != "done" and time.monotonic() < deadline:
                assert client.gang(gang["gang_id"]).status not in ("failed", "cancelled")
                time.sleep(0.3)
            tasks = client.gang(gang["gang_id"]).tasks
            assert {task.worker_id for task in tasks} == {"local-1", "local-2"}
            assert client.logs(tasks[1].id).text == "rank 1 sees 0,1\n"
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(timeout=90) == 0
        assert (tmp_path / "corral-worker-1.log").exists() and (tmp_path / "corral-worker-2.log").exists()
    finally:
        up.kill_everything()
