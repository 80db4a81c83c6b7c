"""The worker's own CPU per running job, with every watchdog armed and sampling.

One real server and one real worker offering ``--jobs`` fake GPUs (``--gpu-sampler fake:FILE``,
the file saying the GPUs are busy, so nothing trips), all other watchdog settings at their
defaults unless ``--worker-arg`` says otherwise. Steps:

1. idle baseline: the worker registered, no job; its CPU (psutil ``cpu_times`` user + system of
   the worker's pid) over ``--window-s``;
2. ``--jobs`` jobs ``{"resources": {"gpus": 1}}`` whose command beats once then sleeps
   (``echo 0 > "$CORRAL_BEAT_FILE"; exec sleep ...``), so each has its budget, its stall watchdog
   armed, and its GPU-health watchdog in its first window reading the GPU and the process tree
   every 5 s; wait until all are running, settle ``--settle-s``, then the worker's CPU over
   ``--window-s`` again;
3. per job: (CPU with the jobs - CPU idle) / window / jobs, in % of one core, against the target
   (< 1%). The figure is everything the agent spends on a running job: its watchdog loop (a stat
   of the beat file every second, a reading every 5 s), its job heartbeat (an HTTP call every
   ``CORRAL_HEARTBEAT_S``, 5 s) and its share of the worker heartbeat. ``sleep`` uses no CPU and
   is a child, not counted.

Every job must still be running with ``watchdog_retries`` 0 at the end (no trip), else the run
fails. With ``--worker-arg=--stall-timeout-s=10`` the stall watchdog also confirms (three reads a
second apart) every ~12 s per job, which shows the cost of confirming.

    .venv/bin/python bench/watchdog_cpu.py [--jobs 20] [--window-s 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psutil

import harness
import machine
from corral.client import Client

TARGET_PER_JOB_PCT = 1.0


def worker_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(pid: int, window_s: float) -> float:
    """The worker's CPU over ``window_s``, in % of one core."""
    before = worker_cpu_s(pid)
    started = time.monotonic()
    time.sleep(window_s)
    used = worker_cpu_s(pid) - before
    return 100.0 * used / (time.monotonic() - started)


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def precise(label: str, value: float, target: float | None = None) -> str:
    """``harness.figure`` with three decimals: a job's share is a small fraction of a percent."""
    line = f"  {label:<48} {value:>10.3f} {'% core':<8}"
    if target is None:
        return line
    return f"{line} target < {target:g}    {'PASS' if value < target else 'BELOW'}"


def run(args: argparse.Namespace, directory: Path, processes: harness.Processes) -> dict[str, float]:
    gpu_file = directory / "gpu.json"
    gpu_file.write_text(json.dumps({"util_pct": 50, "mem_used_mb": 1000}))
    with harness.store_url("sqlite", directory) as db_url:
        server = harness.start_server(processes, db_url, directory, args.server_arg)
        worker_args = [
            "--gpus", str(args.jobs), "--vram-mb", "1000", "--gpu-model", "FakeGPU",
            "--gpu-sampler", f"fake:{gpu_file}",
            "--worker-heartbeat-s", "15", "--shutdown-timeout-s", "0", "--preempt-grace-s", "1",
            *args.worker_arg,
        ]  # fmt: skip
        worker = harness.start_worker(
            processes, server.url, "bench-watchdog", directory, 64, 5.0, worker_args
        )
        with Client(server.url) as client:
            wait_until(lambda: any(w["id"] == "bench-watchdog" for w in client.workers()), 30, "registration")
            time.sleep(args.settle_s)
            idle_pct = measure(worker.process.pid, args.window_s)

            sleep_s = int(args.window_s * 2 + args.settle_s + 120)  # leftovers end on their own
            command = f'echo 0 > "$CORRAL_BEAT_FILE"; exec sleep {sleep_s}'
            jobs = [
                client.submit_body({"command": command, "resources": {"gpus": 1}}) for _ in range(args.jobs)
            ]
            ids = {job["id"] for job in jobs}

            def all_running() -> bool:
                running = {job["id"] for job in client.iter_jobs(status="running")}
                return ids <= running

            wait_until(all_running, 60, f"{args.jobs} jobs to run")
            time.sleep(args.settle_s)
            busy_pct = measure(worker.process.pid, args.window_s)

            final = [client.get_job(job_id) for job_id in sorted(ids)]
            tripped = [job["id"] for job in final if job["status"] != "running" or job["watchdog_retries"]]
            if tripped:
                raise RuntimeError(f"jobs tripped or ended during the measurement: {tripped}")
            log = worker.log.read_text(errors="replace")
            for job_id in ids:
                client.cancel(job_id)
    return {
        "idle_pct": idle_pct,
        "busy_pct": busy_pct,
        "per_job_pct": (busy_pct - idle_pct) / args.jobs,
        "suspicions": float(log.count("stall suspected")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20, help="running jobs (and fake GPUs)")
    parser.add_argument("--window-s", type=float, default=30.0, help="each CPU measurement window")
    parser.add_argument("--settle-s", type=float, default=3.0, help="pause before each window")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on the whole run (s)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra flag for corral worker")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)

    machine.print_machine()
    available, why = harness.worker_available()
    if not available:
        print(f"\npython -m corral worker is not available; nothing measured:\n{why}")
        return 2
    processes = harness.Processes()
    try:
        with harness.bounded(args.timeout), harness.workdir(args.keep) as directory:
            try:
                figures = run(args, directory, processes)
            finally:
                processes.stop_all()
        settings = " ".join(args.worker_arg) or "defaults"
        harness.banner(
            f"worker CPU with {args.jobs} running jobs, every watchdog armed (fake GPU busy; {settings}),"
            f" {args.window_s:.0f} s windows"
        )
        print(precise("worker idle (no job)", figures["idle_pct"]))
        print(precise(f"worker with {args.jobs} jobs", figures["busy_pct"]))
        print(precise("per running job: (jobs - idle) / jobs", figures["per_job_pct"], TARGET_PER_JOB_PCT))
        print(f"  {'stall suspicions cleared (worker log)':<48} {figures['suspicions']:>10.0f}")
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
