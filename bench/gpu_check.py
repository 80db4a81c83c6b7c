"""The worker's GPU side on a real GPU: NVML readings, the GPU-health watchdog, and a job end to end.

Nothing here can run in CI (no GPU there): it is the check a person with a GPU runs, and what the
closing note of a change to ``corral/worker/samplers/nvml.py`` quotes. Without NVML it says so and
exits 0.

1. **Readings.** A PyTorch process on GPU 0 multiplies matrices for ``--busy-s`` seconds, then keeps
   its memory and does nothing for ``--idle-s`` (a job wedged with its model loaded). Every 0.5 s
   the job's view (``JobProbe``: its process tree's memory, the NVML probe of its GPU, per process
   where the driver attributes it) and the worker's view of each GPU (``read_devices``) are
   printed; the probe of an unrelated process set shows whether the per-process attribution works
   here (in a container the driver may report host PIDs).
2. **The GPU-health watchdog** on those real readings (window ``--window-s``, grace
   ``--grace-s``): it must not trip while the GPU is busy, and must trip once the job has been
   idle with static memory for a window.
3. **End to end** (when the server's packages import): a real ``corral server`` and ``corral
   worker --gpu-sampler nvml`` run the same job: the job object shows the GPU utilisation its
   heartbeats report, the worker object each GPU's reading, and the GPU-health watchdog trips the
   job and re-queues it; its second attempt exits at once.

    python bench/gpu_check.py [--busy-s 8] [--idle-s 12] [--window-s 4] [--grace-s 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
from corral.worker.samplers import open_gpu_sampler
from corral.worker.samplers.process import ProcessTreeSampler

# The job: busy, then idle holding its memory; attempt 2 (after a watchdog trip) exits at once.
TORCH_JOB = r"""
import os, sys, time
if os.environ.get("CORRAL_ATTEMPT", "1") != "1":
    print("attempt", os.environ["CORRAL_ATTEMPT"], "exits at once"); sys.exit(0)
import torch
busy_s, idle_s = float(sys.argv[1]), float(sys.argv[2])
device = torch.device("cuda:0")
a = torch.randn(8192, 8192, device=device)
b = torch.randn(8192, 8192, device=device)
print("busy on", torch.cuda.get_device_name(0), flush=True)
end = time.monotonic() + busy_s
while time.monotonic() < end:
    c = a @ b
    torch.cuda.synchronize()
print("idle, holding", torch.cuda.memory_allocated() // 2**20, "MiB", flush=True)
time.sleep(idle_s)
print("done", flush=True)
"""


def check_readings(args: argparse.Namespace, work: Path) -> bool:
    from corral.config import WorkerSettings
    from corral.worker.job_watch import JobProbe, build_watch

    sampler, message = open_gpu_sampler("nvml")
    print(f"sampler: {message}")
    assert sampler is not None
    import pynvml

    count = pynvml.nvmlDeviceGetCount()
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index)) for index in range(count)]
    print(f"GPUs: {count} {names}; driver {pynvml.nvmlSystemGetDriverVersion()}")
    print(f"read_devices before the job: {sampler.read_devices(range(count))}")
    script = work / "torch_job.py"
    script.write_text(TORCH_JOB)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    job = subprocess.Popen([sys.executable, str(script), str(args.busy_s), str(args.idle_s)], env=env)
    probe = JobProbe(job.pid, ProcessTreeSampler(), sampler.probe([0]))
    stranger = sampler.probe([0])
    settings = WorkerSettings(
        gpu_health_window_s=args.window_s,
        gpu_health_grace_s=args.grace_s,
        stall_timeout_s=10_000,
        budget_s=10_000,
    )
    watch = build_watch(settings, {}, [0], work / "beat", probe, sampler.name, {"job_id": "check"})
    trips: list[tuple[float, object]] = []
    started = time.monotonic()
    watch.start_thread(lambda verdict: trips.append((time.monotonic() - started, verdict)))
    seen_busy = False
    busy_reads = flickers = 0  # reads while the device was busy, and those the job's view said 0%
    idle_since: float | None = None
    quiet: list[float] = []  # the current run of idle reads (three in a row: the job went idle)
    while job.poll() is None:
        time.sleep(0.5)
        elapsed = time.monotonic() - started
        reading = probe.read()
        other = stranger.read({1})
        devices = sampler.read_devices([0])
        print(
            f"  t={elapsed:5.1f}s job: gpu {reading.gpu_util_pct}% gpu_mem {reading.gpu_memory_mb} MB"
            f" rss {reading.memory_mb and round(reading.memory_mb)} MB | pid 1's view {other}"
            f" | device {devices}"
        )
        util = reading.gpu_util_pct
        if devices and devices[0].util_pct > 90:
            busy_reads += 1
            flickers += util is not None and util < 5
        if util is not None and util > 50:
            seen_busy = True
            quiet.clear()
        elif seen_busy and idle_since is None and util is not None and util < 5:
            quiet.append(elapsed)
            if len(quiet) == 3:
                idle_since = quiet[0]
    watch.stop()
    sampler.close()
    print(f"job exit {job.returncode}; busy seen {seen_busy}; idle from t={idle_since}")
    print(f"reads of a busy device that the job's view called idle: {flickers} of {busy_reads}")
    for at, verdict in trips:
        print(f"  GPU-health trip at t={at:.1f}s: {verdict}")
    early = [at for at, _ in trips if idle_since is None or at < idle_since]
    ok = seen_busy and idle_since is not None and bool(trips) and not early and flickers <= 1
    print("readings and watchdog:", "PASS" if ok else "FAIL")
    return ok


def check_end_to_end(args: argparse.Namespace, work: Path) -> bool:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        print(f"end to end skipped: {error}")
        return True
    import harness
    from corral.client import Client

    processes = harness.Processes()
    try:
        server = harness.start_server(processes, f"sqlite:///{work / 'corral.db'}", work)
        processes.start(
            "worker",
            [
                harness.PYTHON, "-m", "corral", "worker", "--server", server.url, "--worker-id", "gpu0",
                "--worker-address", "127.0.0.1", "--gpu-sampler", "nvml", "--heartbeat-s", "1",
                "--worker-heartbeat-s", "1", "--gpu-health-window-s", str(args.window_s),
                "--gpu-health-grace-s", str(args.grace_s), "--preempt-grace-s", "2",
            ],
            work / "worker.log",
        )  # fmt: skip
        script = work / "torch_job.py"
        with Client(server.url) as client:
            deadline = time.monotonic() + 60
            while not client.workers() and time.monotonic() < deadline:
                time.sleep(0.2)
            worker = client.workers()[0]
            print(f"worker registered: {worker.resources.to_wire()} gpu_model {worker.gpu_model}")
            job = client.submit_body(
                {
                    "command": f"{sys.executable} {script} {args.busy_s} {args.idle_s}",
                    "resources": {"gpus": 1},
                }
            )
            peak = 0.0
            deadline = time.monotonic() + args.busy_s + args.idle_s + 60
            current = client.get_job(job.id)
            while current.status not in ("done", "failed", "cancelled") and time.monotonic() < deadline:
                time.sleep(0.5)
                current = client.get_job(job.id)
                peak = max(peak, current.gpu_util_pct or 0.0)
            stats = client.worker("gpu0").gpu_stats
            events = [
                (event.to, event.reason.code if event.reason else None) for event in client.events(job.id)
            ]
        print(
            f"job {current.status}, attempts {current.attempts}, watchdog_retries {current.watchdog_retries}"
        )
        print(f"peak gpu_util_pct reported by its heartbeats: {peak}; rss_mb {current.rss_mb}")
        print(f"worker gpu_stats: {[stat.to_wire() for stat in stats]}")
        print(f"events: {events}")
        ok = (
            current.status == "done"
            and current.watchdog_retries == 1
            and ("pending", "watchdog_gpu_health") in events
            and peak > 50
            and bool(stats)
        )
        print("end to end:", "PASS" if ok else "FAIL")
        if not ok:
            print((work / "worker.log").read_text()[-4000:])
        return ok
    finally:
        processes.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--busy-s", type=float, default=8.0)
    parser.add_argument("--idle-s", type=float, default=12.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    parser.add_argument("--grace-s", type=float, default=10.0, help="the first window (CUDA start-up)")
    args = parser.parse_args(argv)
    machine.print_machine()
    with tempfile.TemporaryDirectory(prefix="corral-gpu-check-") as directory:
        work = Path(directory)
        sampler, message = open_gpu_sampler("nvml")
        if sampler is None:
            print(f"{message}: nothing to check on this machine")
            return 0
        sampler.close()
        results = [check_readings(args, work), check_end_to_end(args, work)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
