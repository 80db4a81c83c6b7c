"""The worker end to end: a real server process, real worker processes, real jobs, real signals."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import (
    ServerProcess,
    free_port,
    process_gone,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.e2e

# A shell barrier: wait (at most ~10 s) until N marker files exist in DIR, so the jobs that pass
# it provably ran at the same time. Exits 9 when the others never showed up.
BARRIER = (
    'i=0; while [ "$(ls {dir} | grep -c "\\.{suffix}$")" -lt {count} ]; do '
    "i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.05; done"
)


def barrier(directory: Path, suffix: str, count: int) -> str:
    return BARRIER.format(dir=directory, suffix=suffix, count=count)


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        key, separator, value = line.partition("=")
        if separator:
            values[key] = value
    return values


def test_job_runs_with_its_environment_and_ends_done(server, client: Client, start_worker, tmp_path: Path):
    worker = start_worker(server.url, "w1")
    env_file = tmp_path / "env.txt"
    job = client.submit_body({"command": f"env > {env_file}; echo hello", "env": {"GREETING": "hi there"}})

    done = wait_status(client, job["id"], {"done", "failed"})

    assert done["status"] == "done", done
    assert done["worker_id"] == "w1"
    environment = read_env_file(env_file)
    assert environment["CORRAL_JOB_ID"] == job["id"]
    assert environment["CORRAL_ATTEMPT"] == "1"
    assert environment["CORRAL_SERVER"] == server.url
    assert environment["GREETING"] == "hi there"
    assert environment["CUDA_VISIBLE_DEVICES"] == ""
    beat_file = Path(environment["CORRAL_BEAT_FILE"])
    assert Path(environment["CORRAL_CHECKPOINT_OUT"]).parent == beat_file.parent
    # Once the attempt is over its directory holds nothing (kept empty for the next attempt, or
    # removed), and it is gone once the worker has exited.
    wait_for(
        lambda: not beat_file.parent.exists() or not any(beat_file.parent.iterdir()),
        5,
        "the job's temporary directory to be emptied",
    )
    worker.signal(signal.SIGTERM)
    worker.process.wait(timeout=30)
    assert not beat_file.parent.exists()


def test_a_worker_the_server_refuses_for_good_exits_with_its_message(server, client: Client, start_worker):
    """A registration no retry can fix (issue 24): ``--gpus 2000000`` is out of the server's
    range, so the worker exits 1 with the server's message instead of asking for ever."""
    worker = start_worker(server.url, "huge", "--gpus", "2000000")
    assert worker.process.wait(timeout=30) == 1, worker.log()
    log = worker.log()
    assert "the server refused the registration: invalid_request: resources.gpus" in log, log
    assert client.workers() == []


def test_failing_job_is_retried_then_failed_with_its_output(server, client: Client, start_worker):
    start_worker(server.url, "w1")
    job = client.submit_body({"command": 'echo "boom on attempt $CORRAL_ATTEMPT"; exit 3', "max_retries": 2})

    failed = wait_status(client, job["id"], {"done", "failed"})

    assert failed["status"] == "failed", failed
    assert failed["attempts"] == 2
    assert failed["exit_code"] == 3
    assert failed["error"] == "exited with code 3"
    assert "boom on attempt 2" in failed["output_tail"]
    transitions = [(event["from"], event["to"]) for event in client.events(job["id"])]
    assert ("running", "pending") in transitions
    assert transitions[-1] == ("running", "failed")


def test_gpu_jobs_see_their_own_devices(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "gpu-host", "--gpus", "2", "--vram-mb", "16000", "--gpu-model", "FakeGPU")
    command = f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/$CORRAL_JOB_ID.gpu; {barrier(tmp_path, "gpu", 2)}'
    jobs = [
        client.submit_body({"command": command, "resources": {"gpus": 1, "vram_mb": 1000}}) for _ in range(2)
    ]

    finished = [wait_status(client, job["id"], {"done", "failed"}) for job in jobs]

    assert [job["status"] for job in finished] == ["done", "done"], finished
    seen = set()
    for job in finished:
        visible = (tmp_path / f"{job['id']}.gpu").read_text().strip()
        assert visible == ",".join(str(index) for index in job["gpu_indices"])
        assert len(job["gpu_indices"]) == 1
        seen.add(visible)
    assert seen == {"0", "1"}


def test_cancel_sends_sigterm_to_the_job_group(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1")
    command = (
        f"sleep 30 & echo $! > {tmp_path}/child; "
        f"trap 'echo term > {tmp_path}/term; exit 143' TERM; "
        f"echo up > {tmp_path}/up; while true; do sleep 0.1; done"
    )
    job = client.submit_body({"command": command})
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    client.cancel(job["id"])
    cancelled = wait_status(client, job["id"], {"cancelled", "done", "failed"})

    assert cancelled["status"] == "cancelled", cancelled
    assert (tmp_path / "term").read_text().strip() == "term"
    child = int((tmp_path / "child").read_text())
    wait_for(lambda: process_gone(child), 5, "the background child to get the group's SIGTERM")


def test_job_ignoring_sigterm_is_killed_after_the_grace(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1", "--preempt-grace-s", "0.5")
    # The job notes the SIGTERM and goes on: a line written after it shows the KILL did not come
    # with the TERM but after it (the grace).
    command = (
        f"trap 'echo term > {tmp_path}/term' TERM; echo $$ > {tmp_path}/pid; sleep 30 & echo $! >"
        f" {tmp_path}/child; echo up > {tmp_path}/up; while true; do sleep 0.05;"
        f" if [ -e {tmp_path}/term ]; then echo alive >> {tmp_path}/after; fi; done"
    )
    job = client.submit_body({"command": command})
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    client.cancel(job["id"])
    cancelled = wait_status(client, job["id"], {"cancelled", "done", "failed"})

    assert cancelled["status"] == "cancelled", cancelled
    assert (tmp_path / "term").exists(), "the job got a SIGTERM first"
    assert (tmp_path / "after").exists(), "and ran on after it: the KILL waited for the grace"
    for name in ("pid", "child"):
        pid = int((tmp_path / name).read_text())
        wait_for(lambda pid=pid: process_gone(pid), 5, f"process {name} to be SIGKILLed")


def test_several_jobs_run_at_once_on_one_worker(server, client: Client, start_worker, tmp_path: Path):
    start_worker(server.url, "w1", "--cpus", "4")
    command = f"touch {tmp_path}/$CORRAL_JOB_ID.run; {barrier(tmp_path, 'run', 3)}"
    jobs = [client.submit_body({"command": command, "resources": {"cpus": 1}}) for _ in range(3)]

    finished = [wait_status(client, job["id"], {"done", "failed"}) for job in jobs]

    assert [job["status"] for job in finished] == ["done"] * 3, finished


def test_sigterm_lets_the_running_job_finish_but_claims_nothing_new_then_exits_0(
    server, client: Client, start_worker, tmp_path: Path
):
    worker = start_worker(server.url, "w1", "--shutdown-timeout-s", "30")
    release = tmp_path / "job.release"
    job = client.submit_body(
        {"command": f"echo up > {tmp_path}/up; {barrier(tmp_path, 'release', 1)}; echo finished"}
    )
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    worker.signal(signal.SIGTERM)
    # The claim loop has stopped (a claim already in flight at the signal may still run its job).
    wait_for(lambda: "shutting down: waiting for running jobs" in worker.log(), 15, "the claim loop to stop")
    # Submitted while the worker is alive, idle enough to take it, and still running `job`:
    # a worker that kept claiming would be woken by this submit and take it at once.
    late = client.submit_body({"command": "true"})
    time.sleep(0.3)
    assert client.get_job(late["id"])["status"] == "pending"
    release.touch()
    worker.process.wait(timeout=15)

    assert worker.process.returncode == 0, worker.log()
    assert client.get_job(job["id"])["status"] == "done"
    assert "worker stopped" in worker.log()
    untouched = client.get_job(late["id"])
    assert (untouched["status"], untouched["attempts"], untouched["worker_id"]) == ("pending", 0, None)
    # ...and it was claimable all along: the next worker takes it.
    start_worker(server.url, "w2")
    finished = wait_status(client, late["id"], {"done", "failed"})
    assert (finished["status"], finished["worker_id"]) == ("done", "w2"), finished


def test_shutdown_timeout_stops_the_job_and_reports_it(server, client: Client, start_worker, tmp_path: Path):
    worker = start_worker(server.url, "w1", "--shutdown-timeout-s", "0.3")
    job = client.submit_body(
        {"command": f"echo up > {tmp_path}/up; echo working; sleep 30", "max_retries": 1}
    )
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    worker.signal(signal.SIGTERM)
    worker.process.wait(timeout=15)  # the job would sleep 30 s: the worker stopped it

    assert worker.process.returncode == 0, worker.log()
    # Handed back: re-queued without spending its only attempt (the stop was the worker's doing).
    released = client.get_job(job["id"])
    assert released["status"] == "pending", released
    assert released["attempts"] == 0
    assert released["error"] == "worker shut down"
    assert released["exit_code"] == 128 + signal.SIGTERM
    assert "working" in released["output_tail"]


def test_second_signal_stops_jobs_at_once(server, client: Client, start_worker, tmp_path: Path):
    worker = start_worker(server.url, "w1", "--shutdown-timeout-s", "60")
    job = client.submit_body({"command": f"echo up > {tmp_path}/up; sleep 30", "max_retries": 1})
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the job to start")

    worker.signal(signal.SIGINT)
    # two signals before the worker's handler ran are one to Python: the second waits for the first
    wait_for(lambda: "SIGINT: shutting down once running jobs finish" in worker.log(), 10, "the first signal")
    worker.signal(signal.SIGINT)
    worker.process.wait(timeout=15)  # within its 60 s shutdown timeout: the second signal stopped it

    assert worker.process.returncode == 0, worker.log()
    assert client.get_job(job["id"])["error"] == "worker shut down"


def test_killed_worker_job_is_requeued_and_finished_by_another(
    start_server, start_worker, reap_groups: list[int], tmp_path: Path
):
    server: ServerProcess = start_server("--heartbeat-timeout-s", "1", "--reaper-tick-s", "0.2")
    first = start_worker(server.url, "w-first")
    command = (
        f'echo $$ > {tmp_path}/pid-$CORRAL_ATTEMPT; [ "$CORRAL_ATTEMPT" = 1 ] && sleep 30; '
        f"echo ran > {tmp_path}/ran-$CORRAL_ATTEMPT"
    )
    with Client(server.url) as client:
        job = client.submit_body({"command": command})
        # The file exists a moment before the shell has written its pid into it.
        pid = wait_for(lambda: (tmp_path / "pid-1").exists() and (tmp_path / "pid-1").read_text().strip(), 10)
        reap_groups.append(int(pid))

        first.process.kill()
        first.process.wait(timeout=10)
        requeued = wait_status(client, job["id"], {"pending"}, timeout_s=10)
        assert requeued["reason"]["code"] == "lease_expired", requeued
        start_worker(server.url, "w-second")
        done = wait_status(client, job["id"], {"done", "failed"})

    assert done["status"] == "done", done
    assert done["worker_id"] == "w-second"
    assert done["attempts"] == 2
    assert (tmp_path / "ran-2").exists()


def test_worker_that_lost_its_job_stops_it_and_reports_nothing(start_server, start_worker, tmp_path: Path):
    server: ServerProcess = start_server("--heartbeat-timeout-s", "1", "--reaper-tick-s", "0.2")
    # The fence off: thawed, a fenced worker may hand the job back (a report, refused with 409)
    # before its first heartbeat hears the 409; this test is about the heartbeat's 409.
    frozen = start_worker(server.url, "w-frozen", "--no-self-fence")
    command = (
        f"trap 'echo stopped > {tmp_path}/term-$CORRAL_ATTEMPT; exit 143' TERM; "
        f"echo up > {tmp_path}/up-$CORRAL_ATTEMPT; "
        '[ "$CORRAL_ATTEMPT" = 1 ] && while true; do sleep 0.1; done; exit 0'
    )
    with Client(server.url) as client:
        job = client.submit_body({"command": command})
        wait_for(lambda: (tmp_path / "up-1").exists(), 10, "the first attempt to start")

        frozen.signal(signal.SIGSTOP)
        wait_status(client, job["id"], {"pending"}, timeout_s=10)
        start_worker(server.url, "w-second")
        done = wait_status(client, job["id"], {"done", "failed"})
        assert done["status"] == "done", done
        events_when_done = client.events(job["id"])

        frozen.signal(signal.SIGCONT)
        wait_for(lambda: (tmp_path / "term-1").exists(), 10, "the stale attempt to be stopped")
        wait_for(lambda: "job stopped after it was lost" in frozen.log(), 5, "the stale attempt to end")

        after = client.get_job(job["id"])
        assert after["status"] == "done"
        assert after["worker_id"] == "w-second"
        assert client.events(job["id"]) == events_when_done
    assert "stale_attempt" in frozen.log()
    assert "fail report" not in frozen.log()


def test_worker_waits_for_an_unreachable_server(start_server, start_worker, tmp_path: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    worker = start_worker(url, "w-early")
    wait_for(lambda: "server unreachable" in worker.log(), 10, "the worker to notice the missing server")
    assert worker.process.poll() is None

    server: ServerProcess = start_server(port=port)
    with Client(server.url) as client:
        job = client.submit_body({"command": "true"})
        done = wait_status(client, job["id"], {"done", "failed"}, timeout_s=15)
    assert done["status"] == "done", done
    assert done["worker_id"] == "w-early"


def test_a_worker_stopped_cleanly_is_offline_at_once(server, client: Client, start_worker):
    """SIGTERM: the worker says it is leaving, so it shows offline the moment it has exited, not
    after CORRAL_WORKER_OFFLINE_S (60 s here) of silence; a restart brings it back."""
    worker = start_worker(server.url, "w1")
    wait_for(lambda: any(w["id"] == "w1" for w in client.workers()), 10, "the worker to register")
    worker.signal(signal.SIGTERM)
    assert worker.process.wait(timeout=30) == 0
    assert client.worker("w1")["status"] == "offline"
    client.remove_worker("w1")
    assert client.workers() == []
    start_worker(server.url, "w1")
    wait_for(lambda: any(w["status"] == "active" for w in client.workers()), 10, "the worker to come back")
