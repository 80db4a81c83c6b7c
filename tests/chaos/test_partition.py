"""A worker cut off from its server (issue 24 item 3): with the self-fence its job stops before the
lease ends, so attempt 2 on another worker never runs beside it for longer than the margin; without
it, attempt 1 runs on for as long as the cut lasts. And a server restart shorter than the lease
stops nothing, fence or not.

Each attempt writes "ATTEMPT TIMESTAMP" lines to a file as it runs: the overlap of the two attempts
is read from the jobs' own output, not from the worker's say-so.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from corral.client import Client
from corral.testing.proxy import PartitionProxy
from corral.worker.fence import effective_margin_s
from tests.chaos.conftest import FAST_SERVER, assert_history, kill9, port_of, wait_all_terminal
from tests.e2e.conftest import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

LEASE_S = float(FAST_SERVER[FAST_SERVER.index("--heartbeat-timeout-s") + 1])
MARGIN_S = 1.0
#: attempt 1 would run a minute; attempt 2 three seconds, then ends the job
COMMAND = (
    'if [ "$CORRAL_ATTEMPT" = 1 ]; then n=1200; else n=60; fi; '
    'for i in $(seq $n); do echo "$CORRAL_ATTEMPT $(date +%s.%N)" >> {runs}; sleep 0.05; done'
)


def stamps(runs: Path) -> dict[int, list[float]]:
    """Each attempt's timestamps, from the job's own lines (a line cut short by a kill is left out)."""
    found: dict[int, list[float]] = {}
    for line in runs.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            found.setdefault(int(parts[0]), []).append(float(parts[1]))
    return found


def first_of(runs: Path, attempt: int) -> float | None:
    if not runs.exists():
        return None
    times = stamps(runs).get(attempt)
    return times[0] if times else None


def renewed_after(last_heartbeat_at: str | None, moment: float) -> bool:
    return last_heartbeat_at is not None and datetime.fromisoformat(last_heartbeat_at).timestamp() > moment


@dataclass
class Cut:
    """A job whose attempt 1 ran on w1 when the proxy cut w1 off, and whose attempt 2 started."""

    proxy: PartitionProxy
    first: WorkerProcess
    client: Client
    job_id: str
    runs: Path
    cut_at: float
    second_started: float


@contextmanager
def cut_mid_job(
    sqlite_url: str, start_server, start_worker, tmp_path: Path, fence_flag: str
) -> Iterator[Cut]:
    """A job started on w1 (behind a proxy), w2 waiting beside it; then the proxy cuts w1 off,
    the lease runs out, and attempt 2 starts on w2."""
    server = start_server("--db", sqlite_url, *FAST_SERVER)
    runs = tmp_path / "runs.txt"
    with PartitionProxy(server.url) as proxy, Client(server.url) as client:
        margin = str(MARGIN_S)
        first = start_worker(proxy.url, "w1", "--cpus", "1", fence_flag, "--self-fence-margin-s", margin)
        job = client.submit_body({"command": COMMAND.format(runs=runs), "resources": {"cpus": 1}})
        wait_for(lambda: first_of(runs, 1), 15, "attempt 1 to start")
        start_worker(server.url, "w2", "--cpus", "1")
        proxy.cut()
        cut_at = time.time()
        second_started = wait_for(lambda: first_of(runs, 2), 30, "attempt 2 to start on w2")
        yield Cut(proxy, first, client, job.id, runs, cut_at, second_started)


def test_a_fenced_worker_stops_its_copy_before_attempt_two_starts(
    sqlite_url: str, start_server, start_worker, tmp_path: Path
):
    with cut_mid_job(sqlite_url, start_server, start_worker, tmp_path, "--self-fence") as cut:
        assert wait_all_terminal(cut.client, 1, 30) == {cut.job_id: "done"}
        cut.proxy.heal()
        # The fenced attempt's hand-back lands on a job that moved on: refused, and dropped.
        wait_for(lambda: "stale_attempt" in cut.first.log() or None, 20, "w1's late report to be refused")
        times = stamps(cut.runs)
        overlap_s = max(times[1]) - min(times[2])
        margin_s = effective_margin_s(LEASE_S, MARGIN_S)
        print(f"fence on: overlap of attempt 1 and attempt 2: {overlap_s:.3f} s (margin {margin_s} s)")
        assert overlap_s <= margin_s, f"attempt 1 ran {overlap_s:.3f} s beside attempt 2"
        # The last renewal came before the cut: attempt 1 ended within a lease of it.
        assert max(times[1]) - cut.cut_at < LEASE_S
        assert "self-fence" in cut.first.log()
        assert [event.attempt for event in cut.client.events(cut.job_id) if event.to == "done"] == [2]
        # The last line attempt 1 wrote stays its last: nothing of it runs any more.
        assert max(stamps(cut.runs)[1]) == max(times[1])
    assert_history(sqlite_url)


def test_without_the_fence_a_cut_off_worker_runs_its_copy_beside_attempt_two(
    sqlite_url: str, start_server, start_worker, tmp_path: Path
):
    """The old behaviour, kept behind ``--no-self-fence``: the copy runs on until the link heals
    (and then stops at the first 409)."""
    with cut_mid_job(sqlite_url, start_server, start_worker, tmp_path, "--no-self-fence") as cut:
        overlap_s = 2 * effective_margin_s(LEASE_S, MARGIN_S)
        wait_for(
            lambda: max(stamps(cut.runs)[1]) >= cut.second_started + overlap_s or None,
            20,
            "attempt 1 to run on beside attempt 2",
        )
        cut.proxy.heal()
        wait_for(
            lambda: "job stopped after it was lost" in cut.first.log() or None, 20, "w1 to stop its copy"
        )
        assert wait_all_terminal(cut.client, 1, 30) == {cut.job_id: "done"}
        assert "self-fence" not in cut.first.log()
    assert_history(sqlite_url)


def test_a_server_restart_shorter_than_the_lease_stops_nothing(
    sqlite_url: str, start_server, start_worker, tmp_path: Path
):
    """kill -9 and an immediate restart, with the fence on: the job runs on through it and ends
    done in its first attempt. A lease of 20 s, so the restart (a few seconds on a loaded machine)
    stays well inside the fence's 19 s."""
    flags = [*FAST_SERVER]
    flags[flags.index("--heartbeat-timeout-s") + 1] = "20"
    server = start_server("--db", sqlite_url, *flags)
    worker = start_worker(server.url, "w1", "--cpus", "1", "--self-fence", "--self-fence-margin-s", "1")
    go = tmp_path / "go"
    command = f"touch {tmp_path}/up; while [ ! -e {go} ]; do sleep 0.05; done"
    with Client(server.url) as client:
        job = client.submit_body({"command": command, "resources": {"cpus": 1}})
        wait_for(lambda: (tmp_path / "up").exists() or None, 15, "the job to start")
    kill9(server)
    restarted_at = time.monotonic()
    server = start_server("--db", sqlite_url, *flags, port=port_of(server))
    back_at = time.time()
    print(f"server back after {time.monotonic() - restarted_at:.2f} s")
    with Client(server.url) as client:
        # The restarted server hears the worker again (a renewed lease), then the job may end.
        wait_for(
            lambda: renewed_after(client.get_job(job.id).last_heartbeat_at, back_at) or None,
            15,
            "the worker's heartbeats to reach the restarted server",
        )
        go.touch()
        assert wait_all_terminal(client, 1, 30) == {job.id: "done"}
        events = client.events(job.id)
        assert [event.attempt for event in events if event.to == "running"] == [1]
    assert "server unreachable" in worker.log(), "the worker never noticed the restart"
    assert "self-fence" not in worker.log()
    assert_history(sqlite_url)
