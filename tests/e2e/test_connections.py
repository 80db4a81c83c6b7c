"""A real ``corral server`` under a small open-file limit, flooded with idle connections (issue 24:
about 1,000 idle sockets under a systemd unit's 1,024 made every request fail and killed the
planner's child process). The server keeps a reserve of descriptors: past its connection limit a
new client is answered 503 ``unavailable`` or closed, and once the flood leaves it serves again,
its child processes included."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import _read_listen_line, _stop, clean_environment, wait_for

pytestmark = pytest.mark.e2e

#: the open-file limit the server runs under: soft and hard, so it cannot raise it
DESCRIPTORS = 320


def _ask(port: int) -> bytes:
    """``GET /healthz`` on a fresh connection: the status line and body, or b"" when closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and (b"}" in answer or b"ok" in answer):
                    break
            return answer
        except (ConnectionResetError, BrokenPipeError):
            return b""


def test_a_flood_of_idle_connections_is_refused_and_the_server_keeps_working(tmp_path: Path):
    # the shell sets the limit (soft and hard alike) and becomes the server
    command = ["/bin/sh", "-c", f'ulimit -n {DESCRIPTORS} && exec "$0" "$@"', sys.executable]
    command += ["-m", "corral", "server", "--db", f"sqlite:///{tmp_path}/c.db", "--port", "0"]
    command += ["--header-timeout-s", "120"]  # the flood stays until the test closes it
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, env=clean_environment(), cwd=tmp_path
    )
    flood: list[socket.socket] = []
    try:
        url = _read_listen_line(process)
        port = int(url.rsplit(":", 1)[1])
        # open idle connections until a new client is refused
        refused = b""
        while len(flood) < DESCRIPTORS:
            flood.extend(socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8))
            answer = _ask(port)
            if not answer.startswith(b"HTTP/1.1 200"):
                refused = answer
                break
        assert refused.startswith(b"HTTP/1.1 503"), refused[:300]
        assert b'"unavailable"' in refused
        # then far more than the limit: each is closed at once or answered 503, never a crash
        for _ in range(DESCRIPTORS):
            with contextlib.suppress(OSError):
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        assert process.poll() is None
        for sock in flood:
            sock.close()
        flood.clear()
        wait_for(lambda: _ask(port).startswith(b"HTTP/1.1 200"), 15, "the server to serve again")
        # the large list is built by the reader process, started now: its pipes need descriptors
        listed = httpx.get(f"{url}/jobs", params={"limit": 1000}, timeout=15)
        assert listed.status_code == 200, listed.text
        children = psutil.Process(process.pid).children()
        assert any("corral.server.offload" in " ".join(child.cmdline()) for child in children)
        server_log = (tmp_path / "server.log").read_text(errors="replace")
        assert "connections limited by the open-file limit" in server_log
        assert "Too many open files" not in server_log
    finally:
        for sock in flood:
            sock.close()
        _stop(process, (signal.SIGTERM,), 10)
        if process.stdout is not None:
            process.stdout.close()
        log.close()
