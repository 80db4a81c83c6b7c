"""The chaos suite: real servers and workers, a fault injected mid-flight, then the history checker
(``corral.testing.history``) on the store. Bounded: each scenario runs in seconds to ~25 s, with
short leases so the recovery paths run in test time.

The e2e fixtures (``start_server``, ``start_worker``, ``reap_groups``) are shared from
``tests/e2e/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from corral.client import Client
from corral.domain.status import TERMINAL
from corral.testing import history
from tests.conftest import postgres_schema_url
from tests.e2e.conftest import (  # noqa: F401 (fixtures)
    ServerProcess,
    free_port,
    reap_groups,
    start_server,
    start_worker,
    wait_for,
)

#: a lease of 6 s, loops every 0.2 s: recovery paths run in test time. With 3 s, about one full CI run
#: in five ended the claim-storm scenario with a job failed, not reproduced alone (most likely leases
#: lost to the load of the whole suite on 2 cores; not proven)
FAST_SERVER = (
    "--heartbeat-timeout-s", "6",
    "--reaper-tick-s", "0.2",
    "--admission-tick-s", "0.2",
    "--worker-offline-s", "6",
    "--dead-worker-after-s", "6",
    "--reservation-timeout-s", "10",
    "--retention-tick-s", "1",
)  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'chaos.db'}"
    else:
        yield from postgres_schema_url()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    yield from postgres_schema_url()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'chaos.db'}"


def port_of(server: ServerProcess) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


def kill9(server: ServerProcess) -> None:
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=10)


def statuses(client: Client) -> dict[str, str]:
    jobs: dict[str, str] = {}
    after = None
    while True:
        page = client.list_jobs_page(limit=5000, after=after)
        jobs.update((job.id, job.status) for job in page.items)
        if page.next is None:
            return jobs
        after = page.next


def describe_failures(client: Client, ended: dict[str, str]) -> str:
    """Each job that did not end ``done``: its fields and its events, for the assertion message."""
    lines = []
    for job_id, status in sorted(ended.items()):
        if status == "done":
            continue
        job = client.get_job(job_id)
        lines.append(
            f"{job_id} {status} attempts={job.attempts} exit_code={job.exit_code} error={job.error!r} "
            f"gang={job.gang_id} tail={job.output_tail!r}"
        )
        lines.extend(f"    {event.model_dump(exclude_none=True)}" for event in client.events(job_id))
    return "\n".join(lines)


def wait_all_terminal(client: Client, count: int, timeout_s: float) -> dict[str, str]:
    def ended() -> dict[str, str] | None:
        try:
            now = statuses(client)
        except Exception:
            return None  # the server is restarting
        return now if len(now) == count and all(status in TERMINAL for status in now.values()) else None

    return wait_for(ended, timeout_s, f"{count} jobs to end")


def assert_history(db_url: str) -> history.Verdict:
    verdict = history.check_url(db_url)
    assert verdict.ok, verdict.summary()
    return verdict


def submit_with_retries(client: Client, job: dict[str, Any], key: str, timeout_s: float = 20.0) -> Any:
    """A client that retries a submit through an outage with the same idempotency key."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.submit_body(job, idempotency_key=key)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (``initdb`` in a temporary directory, a free port):
    the shared one on 5432 serves every other test and must never be restarted."""

    bin_dir: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *arguments: str) -> None:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data),
                *arguments,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.ctl("-w", "-l", str(self.data.parent / "postgres.log"), "-o", options, "start")

    def crash_restart(self) -> None:
        """``immediate`` is a crash as far as the data goes (recovery runs at the next start)."""
        self.ctl("-w", "-m", "immediate", "stop")
        time.sleep(1.0)
        self.start()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs initdb, root and runuser to run a private PostgreSQL cluster")
    bin_dir = found[-1].parent
    # not under pytest's tmp_path: the postgres user cannot traverse root's 0700 directories
    home = Path(tempfile.mkdtemp(prefix="corral-chaos-pg-"))
    shutil.chown(home, "postgres")
    data = home / "data"
    subprocess.run(
        ["runuser", "-u", "postgres", "--", str(bin_dir / "initdb"), "-D", str(data), "-A", "trust",
         "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    cluster = PrivatePostgres(bin_dir, data, free_port())
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            cluster.ctl("-w", "-m", "immediate", "stop")
        shutil.rmtree(home, ignore_errors=True)
