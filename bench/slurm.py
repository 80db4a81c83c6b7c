"""The Slurm baseline for ``e2e.py``: jobs/s of ``true`` jobs through a private one-node Slurm cluster.

Issue 26 sets corral's end-to-end target (``bench/e2e.py``) at 10x "tuned Slurm (64 slots,
``batch_sched_delay=0``) in the same sitting". This script is that reference, so the ratio is
measured on the same box at the same moment instead of quoted from memory.

For each of ``--repeat`` runs it starts a fresh cluster in a temporary directory and tears it down
afterwards: its own ``munged`` (a new key, its own socket, pointed at by ``AuthInfo=socket=...``),
its own ``slurm.conf``, state, spool and log directories, ``slurmctld`` and ``slurmd`` in the
foreground on free ports (not the system's services, nothing under /etc touched). The one node is
this host (``hostname -s``, address 127.0.0.1) with ``CPUs=64``: the 2-core box oversubscribed as
corral's workers are with ``--cpus 64``. Then ``--jobs`` (1,000) jobs of ``true``, one CPU each, are
submitted as one job array (``sbatch --array=0-999 -c 1 -o /dev/null --wrap true``: Slurm's batch
submit, the counterpart of corral's ``POST /jobs/batch``) or, with ``--submit individual``, one
``sbatch`` per job. The figure is jobs / (the moment the last job's completion record appeared -
the moment the first submit was sent), one clock, one machine.

How the end is taken. ``JobCompType=jobcomp/filetxt`` makes ``slurmctld`` append one line per ended
job (``JobState=``, ``EndTime=``...) to a file in the temporary directory. Its ``EndTime`` has
one-second resolution, too coarse for a run of a few tens of seconds, so the file is polled every
20 ms and the wall clock noted when its line count reaches ``--jobs`` (the figure: the counterpart of
corral's last ``finished_at``); ``squeue -h`` is polled every 0.25 s and the wall clock noted when
the queue is empty (every job's resources released, epilogs done); both are printed, with the
jobs/s from the last ``EndTime`` (a range, its second truncated). Every job must end ``COMPLETED``
in the completion file, or the run fails.

Tuning (the default; ``--stock`` leaves each of these at Slurm's default for comparison):

* ``SchedulerParameters=batch_sched_delay=0``: start batch jobs at once instead of letting the
  scheduling of a burst of batch submits be delayed up to 3 s (issue 26's definition of tuned).
* ``sched_min_interval=0``: no throttle between event-triggered scheduling passes (default 2 us).
* ``default_queue_depth=1000``: each event-triggered pass looks at up to 1,000 pending jobs instead
  of 100, so a pass that has 64 free slots never stops short of filling them.
* ``bf_interval=1``: the backfill pass (which also starts jobs) every second instead of every 30.
* ``MinJobAge=2``: ended jobs leave the controller's table after 2 s instead of 300, so the job
  table each pass and each ``squeue`` walks stays small.
* ``SlurmctldDebug=error``, ``SlurmdDebug=error``: no ``info`` lines (several per job) written by
  the daemons while they work.

Common to both (what running here needs, and what is not a scheduling choice): ``SelectType=
select/cons_tres`` with ``SelectTypeParameters=CR_CPU`` (CPUs are the consumable, 64 jobs at once);
``SlurmdParameters=config_overrides`` so ``slurmd`` accepts the declared 64 CPUs and small
``RealMemory`` on a 2-core box; ``ProctrackType=proctrack/pgid`` and ``TaskPlugin=task/none`` (no
cgroup setup per job: cgroups are not delegated in this sandbox, and corral's e2e jobs run without
one too); ``JobAcctGatherType=jobacct_gather/none`` and ``AccountingStorageType=
accounting_storage/none`` (no accounting daemon); ``MaxJobCount`` and ``MaxArraySize`` above
``--jobs``. ``MessageTimeout`` stays at its default (10 s): it matters only when a message is lost,
which on the loopback does not happen. ``--set KEY=VALUE`` adds or overrides any line to try
another tuning.

Reading the figure: ``slurmctld`` starts jobs in bursts of up to 64, one per main scheduling pass,
about once a second, so 64 slots cap this node near 64 jobs/s (~59 measured on a calm box); when the
box is busy ``slurmd``'s launches (a ``slurmstepd`` per job) stretch a burst to 1.5-2 s (33-44
jobs/s). Compare ``e2e.py`` only with a run of the same sitting.

    .venv/bin/python bench/slurm.py [--jobs 1000] [--repeat 3] [--stock] [--submit array|individual]
        [--install]   # apt-get install slurm-wlm munge first when Slurm is missing (as root)

Slurm is a bench-time dependency only: nothing in CI or the tests uses it. Without it (and without
``--install``) the script says how to install it and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import harness
import machine

REQUIRED = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "munged")
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge"
CPUS = 64
COMPLETION_POLL_S = 0.02
QUEUE_POLL_S = 0.25
CEILING_S = 2.0
TUNED = {
    "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000,bf_interval=1",
    "MinJobAge": "2",
    "SlurmctldDebug": "error",
    "SlurmdDebug": "error",
}
END_TIME = re.compile(r"\bEndTime=(\S+)")
START_TIME = re.compile(r"\bStartTime=(\S+)")
JOB_STATE = re.compile(r"\bJobState=(\S+)")


# --- installation ----------------------------------------------------------------------------


def missing_tools() -> list[str]:
    return [tool for tool in REQUIRED if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


def tool(name: str) -> str:
    """The tool's path: ``slurmctld``, ``slurmd`` and ``munged`` live in /usr/sbin, not always on PATH."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


def install() -> bool:
    """Debian's packages with apt-get; an ``apt-get update`` first when the plain install fails."""
    command = ["apt-get", "install", "-y", "slurm-wlm", "munge"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing: {INSTALL}", flush=True)
    if subprocess.run(command, env=env, check=False).returncode == 0:
        return True
    subprocess.run(["apt-get", "update"], env=env, check=False)
    return subprocess.run(command, env=env, check=False).returncode == 0


def slurm_version() -> str:
    result = subprocess.run([tool("slurmctld"), "-V"], capture_output=True, text=True, check=False)
    return result.stdout.strip() or result.stderr.strip() or "unknown"


# --- the cluster -----------------------------------------------------------------------------


@dataclass
class Cluster:
    directory: Path
    conf: Path
    host: str
    env: dict[str, str]
    completions: Path
    daemons: dict[str, harness.Child] = field(default_factory=dict)

    def client(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``sbatch``, ``squeue``...) against this cluster's ``slurm.conf``."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all probes are held open together, so none comes back twice."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def settings(directory: Path, host: str, args: argparse.Namespace) -> dict[str, str]:
    """Every ``slurm.conf`` line but the node and partition: the common part, then the tuning."""
    controller_port, node_port = free_ports(2)
    common = {
        "ClusterName": "corralbench",
        "SlurmctldHost": f"{host}(127.0.0.1)",
        "SlurmctldPort": str(controller_port),
        "SlurmdPort": str(node_port),
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={directory / 'munge' / 'munge.socket'}",
        "StateSaveLocation": str(directory / "state"),
        "SlurmdSpoolDir": str(directory / "spool"),
        "SlurmctldPidFile": str(directory / "slurmctld.pid"),
        "SlurmdPidFile": str(directory / "slurmd.pid"),
        "SlurmctldLogFile": str(directory / "log" / "slurmctld.log"),
        "SlurmdLogFile": str(directory / "log" / "slurmd.log"),
        "ProctrackType": "proctrack/pgid",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/filetxt",
        "JobCompLoc": str(directory / "jobcomp.txt"),
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        "SlurmdParameters": "config_overrides",
        "MaxJobCount": str(max(10_000, 2 * args.jobs)),
        "MaxArraySize": str(max(1001, args.jobs + 1)),
        "ReturnToService": "2",
        "MpiDefault": "none",
        "SwitchType": "switch/none",
    }
    tuned = {} if args.stock else TUNED
    overrides = dict(item.split("=", 1) for item in args.set)
    return {**common, **tuned, **overrides}


def write_config(directory: Path, host: str, args: argparse.Namespace) -> Path:
    lines = [f"{key}={value}" for key, value in settings(directory, host, args).items()]
    lines.append(f"NodeName={host} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=1000 State=UNKNOWN")
    lines.append(f"PartitionName=bench Nodes={host} Default=YES MaxTime=INFINITE State=UP")
    conf = directory / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def start_munge(processes: harness.Processes, directory: Path) -> harness.Child:
    """``munged`` with a fresh key and its own socket; munged wants the socket's directory
    searchable by all and the key readable by its owner alone."""
    munge = directory / "munge"
    munge.mkdir(mode=0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = munge / "munge.socket"
    child = processes.start(
        "munged",
        [
            tool("munged"),
            "--foreground",
            f"--socket={socket_path}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
        directory / "log" / "munged.out",
    )
    wait_for(lambda: socket_path.exists(), 10.0, "munged's socket", child)
    return child


def wait_for(
    ready: Callable[[], bool], timeout_s: float, what: str, child: harness.Child | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if child is not None and child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited with {child.process.returncode}; see {child.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout_s:.0f}s")
        time.sleep(0.1)


@contextlib.contextmanager
def cluster(args: argparse.Namespace, processes: harness.Processes) -> Iterator[Cluster]:
    """A private one-node cluster, stopped and its directory removed on the way out, whatever ends
    the run (a failure, Ctrl-C, SIGTERM, the time bound)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-bench-slurm-"))
    directory.chmod(0o755)  # munged checks every directory above its socket
    for name in ("state", "spool", "log"):
        (directory / name).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = write_config(directory, host, args)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    current = Cluster(directory, conf, host, env, directory / "jobcomp.txt")
    try:
        current.daemons["munged"] = start_munge(processes, directory)
        current.daemons["slurmctld"] = processes.start(
            "slurmctld", [tool("slurmctld"), "-D", "-f", str(conf)], directory / "log" / "slurmctld.out"
        )
        wait_for(lambda: current.client("scontrol", "ping").returncode == 0, 30.0, "slurmctld answer")
        current.daemons["slurmd"] = processes.start(
            "slurmd", [tool("slurmd"), "-D", "-f", str(conf), "-N", host], directory / "log" / "slurmd.out"
        )
        wait_for(lambda: node_state(current) == "idle", 30.0, "idle node", current.daemons["slurmd"])
        yield current
    finally:
        teardown(current, processes, args.keep)


def node_state(current: Cluster) -> str:
    return current.client("sinfo", "-h", "-n", current.host, "-o", "%T").stdout.strip()


def teardown(current: Cluster, processes: harness.Processes, keep: bool) -> None:
    """Cancel what is left (a run cut short), then stop slurmd, slurmctld and munged in that order."""
    if "slurmctld" in current.daemons:
        with contextlib.suppress(Exception):
            current.client("scancel", "--full", "--user=root", timeout=10)
    for name in ("slurmd", "slurmctld", "munged"):
        if name in current.daemons:
            processes.stop(current.daemons[name])
    if keep:
        print(f"(kept cluster directory {current.directory})")
    else:
        shutil.rmtree(current.directory, ignore_errors=True)


# --- one run ---------------------------------------------------------------------------------


def submit(current: Cluster, args: argparse.Namespace) -> None:
    common = ["-c", "1", "-o", "/dev/null", "--wrap", args.command]
    if args.submit == "array":
        commands = [["sbatch", "--parsable", f"--array=0-{args.jobs - 1}", *common]]
    else:
        commands = [["sbatch", "--parsable", *common]] * args.jobs
    for command in commands:
        result = current.client(*command)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed ({result.returncode}): {result.stderr.strip()}")


class CompletionFile:
    """The jobcomp file read as it grows: how many jobs have ended, cheaply, every few ms."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as completions:
            completions.seek(self.offset)
            chunk = completions.read()
            self.offset += len(chunk)
            self.lines += chunk.count(b"\n")
        return self.lines


def queue_empty(current: Cluster) -> bool:
    result = current.client("squeue", "-h", "-o", "%i", timeout=10)
    return result.returncode == 0 and not result.stdout.strip()


def slurm_time(text: str) -> float:
    """A Slurm timestamp (local time, whole seconds) as epoch seconds."""
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def run_once(current: Cluster, args: argparse.Namespace) -> dict[str, float | str]:
    completions = CompletionFile(current.completions)
    pids = {name: child.process.pid for name, child in current.daemons.items()}
    cpu_before = {name: harness.cpu_seconds(pid, children=True) for name, pid in pids.items()}
    started = time.time()
    submit(current, args)
    submitted = time.time()
    deadline = time.monotonic() + args.timeout
    recorded = emptied = float("nan")
    next_queue_poll = 0.0
    while time.monotonic() < deadline:
        if recorded != recorded and completions.count() >= args.jobs:
            recorded = time.time()
        if time.monotonic() >= next_queue_poll:
            next_queue_poll = time.monotonic() + QUEUE_POLL_S
            if queue_empty(current):
                emptied = time.time()
                if recorded != recorded and completions.count() >= args.jobs:
                    recorded = emptied
                break
        for name, child in current.daemons.items():
            if child.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {child.process.returncode} during the run")
        time.sleep(COMPLETION_POLL_S)
    cpu_after = {name: harness.cpu_seconds(pid, children=True) for name, pid in pids.items()}
    return summarize_completions(current, args, started, submitted, recorded, emptied) | {
        f"cpu_{name}": cpu_after[name] - cpu_before[name] for name in pids
    }


def summarize_completions(
    current: Cluster,
    args: argparse.Namespace,
    started: float,
    submitted: float,
    recorded: float,
    emptied: float,
) -> dict[str, float | str]:
    text = current.completions.read_text() if current.completions.exists() else ""
    records = [line for line in text.splitlines() if line.strip()]
    states = Counter(match.group(1) for line in records if (match := JOB_STATE.search(line)))
    ends = [slurm_time(match.group(1)) for line in records if (match := END_TIME.search(line))]
    starts = [slurm_time(match.group(1)) for line in records if (match := START_TIME.search(line))]
    completed = states.get("COMPLETED", 0)
    all_done = completed == args.jobs
    last_end = max(ends, default=float("nan"))
    wall = recorded - started
    return {
        "jobs_s": args.jobs / wall if all_done else float("nan"),
        "wall": wall,
        "empty_wall": emptied - started,
        "empty_jobs_s": args.jobs / (emptied - started) if all_done else float("nan"),
        # EndTime is truncated to its second: the last job ended in [last_end, last_end + 1)
        "endtime_jobs_s_high": args.jobs / max(last_end - started, 1e-3) if all_done else float("nan"),
        "endtime_jobs_s_low": args.jobs / (last_end + 1 - started) if all_done else float("nan"),
        "submit": submitted - started,
        "first_start": min(starts, default=float("nan")) - started,
        "completed": completed,
        "states": ", ".join(f"{name} {count}" for name, count in sorted(states.items())) or "none",
        "timed_out": "yes" if recorded != recorded or emptied != emptied else "no",
    }


# --- output ----------------------------------------------------------------------------------


def describe(args: argparse.Namespace) -> str:
    flavour = "stock" if args.stock else "tuned"
    return (
        f"Slurm ({flavour}), {args.jobs} jobs '{args.command}' (1 cpu each) on 1 node x {CPUS} CPUs,"
        f" submitted as {'one job array' if args.submit == 'array' else 'one sbatch per job'}"
    )


def report(args: argparse.Namespace, result: dict[str, float | str]) -> None:
    harness.banner(describe(args))
    print(f"  load average before the run: {result['load_before']}; after: {result['load_after']}")
    print(
        harness.figure(
            "spawn ceiling (/bin/sh -c true, 2 threads, just before)", float(result["ceiling"]), "spawns/s"
        )
    )
    jobs_s = float(result["jobs_s"])
    if jobs_s == jobs_s:
        print(harness.figure("jobs/s (first submit -> last completion record)", jobs_s, "jobs/s"))
        print(harness.figure("  share of the spawn ceiling", 100 * jobs_s / float(result["ceiling"]), "%"))
        print(
            harness.figure("jobs/s (first submit -> squeue empty)", float(result["empty_jobs_s"]), "jobs/s")
        )
        print(
            f"  jobs/s by the last EndTime (1 s resolution):"
            f" {float(result['endtime_jobs_s_low']):.1f}-{float(result['endtime_jobs_s_high']):.1f} jobs/s"
        )
        print("  the figure: the completion-file poll (every 20 ms); EndTime is too coarse")
    else:
        print(f"  not every job COMPLETED ({result['states']}): no jobs/s figure   FAILED")
    print(harness.figure("wall time (first submit -> last completion record)", float(result["wall"]), "s"))
    print(harness.figure("  sbatch returned after", float(result["submit"]), "s"))
    print(harness.figure("  first job started after (1 s resolution)", float(result["first_start"]), "s"))
    print(harness.figure("  squeue empty after (0.25 s poll)", float(result["empty_wall"]), "s"))
    wall = float(result["wall"])
    cpu = ", ".join(
        f"{name} {float(result[f'cpu_{name}']):.1f}s ({100 * float(result[f'cpu_{name}']) / wall:.0f}%)"
        for name in ("slurmctld", "slurmd", "munged")
        if f"cpu_{name}" in result
    )
    print(f"  CPU during the run (daemons and the children they wait for; not slurmstepd): {cpu}")
    print(f"  completion states: {result['states']}")
    if result["timed_out"] == "yes":
        print(f"  TIMED OUT after {args.timeout:.0f}s")


def summarize(args: argparse.Namespace, results: list[dict[str, float | str]]) -> None:
    harness.banner(f"summary: medians of {len(results)} run(s), {describe(args)}")
    if not results:
        return
    jobs_s = [float(run["jobs_s"]) for run in results]
    empty = [float(run["empty_jobs_s"]) for run in results]
    ceilings = [float(run["ceiling"]) for run in results]
    print(
        f"  {statistics.median(jobs_s):.1f} jobs/s ({', '.join(f'{rate:.1f}' for rate in jobs_s)});"
        f" by squeue empty {statistics.median(empty):.1f} ({', '.join(f'{rate:.1f}' for rate in empty)});"
        f" ceiling {statistics.median(ceilings):.0f} spawns/s"
    )
    print(f"  10x this (issue 26's bar for e2e.py): {10 * statistics.median(jobs_s):.0f} jobs/s")
    loads = " | ".join(f"{run['load_before']}; {run['load_after']}" for run in results)
    print(f"  loads before; after: {loads}")


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--command", default="true", help="each job's command (sbatch --wrap)")
    parser.add_argument("--submit", choices=["array", "individual"], default="array")
    parser.add_argument("--stock", action="store_true", help="Slurm's default scheduling parameters")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra slurm.conf line"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs, each on a fresh cluster; medians")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on one run's jobs (s)")
    parser.add_argument("--install", action="store_true", help=f"run '{INSTALL}' if Slurm is missing")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directories (logs)")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes KEY=VALUE")

    machine.print_machine()
    missing = missing_tools()
    if missing and args.install:
        if not install():
            print("\ninstalling Slurm failed; nothing measured", file=sys.stderr)
            return 2
        missing = missing_tools()
    if missing:
        print(f"\nSlurm is not installed (missing: {', '.join(missing)}); nothing measured.")
        print(f"Install it with `{INSTALL}` (as root), or run this script with --install.")
        return 2
    print(f"  slurm   {slurm_version()}")
    processes = harness.Processes()
    results: list[dict[str, float | str]] = []
    failed = False
    try:
        with harness.bounded(args.repeat * (args.timeout + 90 + CEILING_S)):
            for _ in range(args.repeat):
                load_before = harness.load_average()
                ceiling = harness.spawn_ceiling(CEILING_S)
                with cluster(args, processes) as current:
                    result = run_once(current, args)
                result |= {
                    "load_before": load_before,
                    "load_after": harness.load_average(),
                    "ceiling": ceiling,
                }
                results.append(result)
                report(args, result)
                failed = failed or result["completed"] != args.jobs or result["timed_out"] == "yes"
    except KeyboardInterrupt:
        print("interrupted; the cluster is stopped and removed", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    summarize(args, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
