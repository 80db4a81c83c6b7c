"""Two servers on one SQLite file would both run every loop and both call themselves leader: the
second is refused with a clear message, and a server killed with -9 does not block its restart."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import clean_environment

pytestmark = pytest.mark.e2e


def test_a_second_server_on_one_sqlite_file_is_refused(tmp_path: Path, start_server):
    db = f"sqlite:///{tmp_path}/shared.db"
    first = start_server("--db", db)
    second = subprocess.run(
        [sys.executable, "-m", "corral", "server", "--db", db, "--port", "0"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert second.returncode == 2
    assert f"another corral server (pid {first.process.pid})" in second.stderr
    assert "PostgreSQL" in second.stderr
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=10)
    start_server("--db", db)  # the kernel dropped the dead server's lock
