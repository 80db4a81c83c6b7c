"""How long the everyday CLI commands take, start to exit, beside a bare ``python -c pass``.

A user types ``corral jobs`` dozens of times a day (issue 23): each command must answer at once.
One real server on a temporary SQLite store holds ``--jobs`` (50) jobs and no worker, so the
commands that call it get a full page. Each command runs ``--runs`` (15) times as a fresh process
(the ``corral`` console script, with this checkout's ``src`` first on ``PYTHONPATH``), in turn with the
others so that a burst of other load on the machine lands on all of them. Figures: the median wall
time, start to exit; that minus the bare interpreter's (what corral itself costs); and the median
CPU time of the process (user + system), which other load on a shared machine moves less.

    .venv/bin/python bench/cli.py [--runs 15] [--jobs 50] [--src OTHER_CHECKOUT/src]

``--src`` times another checkout's CLI (before / after a change) against the same server.

Target: every command under 150 ms (wall, median) on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
import machine

TARGET_MS = 150.0


def commands(server_url: str) -> dict[str, list[str]]:
    """The command lines timed: ``corral`` as a user types it (the console script beside this
    interpreter; ``python -m corral`` where there is none, which adds ``runpy``'s few ms)."""
    script = Path(harness.PYTHON).parent / "corral"
    corral = [str(script)] if script.exists() else [harness.PYTHON, "-m", "corral"]
    return {
        "python -c pass": [harness.PYTHON, "-c", "pass"],
        "corral --help": [*corral, "--help"],
        "corral jobs": [*corral, "jobs", "--server", server_url],
        "corral submit --help": [*corral, "submit", "--help"],
        "corral submit -- true": [*corral, "submit", "--server", server_url, "--", "true"],
    }


def time_once(argv: list[str], environment: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of ``argv``, start to exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        argv, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = (time.perf_counter() - started) * 1000.0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000.0
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (the median is shown)")
    parser.add_argument(
        "--jobs", type=int, default=50, help="jobs in the store (a full page for `corral jobs`)"
    )
    parser.add_argument(
        "--src", default=str(harness.ROOT / "src"), help="the corral sources to time (default: this checkout)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on the whole run (s)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server log)")
    args = parser.parse_args(argv)

    machine.print_machine()
    environment = dict(os.environ)
    # A user's commands run from bytecode written at their first run; where the environment says
    # not to write any (PYTHONDONTWRITEBYTECODE, set in some sandboxes), every run would compile
    # corral's modules again and time the compiler.
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    environment["PYTHONPATH"] = os.pathsep.join([args.src, *filter(None, [environment.get("PYTHONPATH")])])
    processes = harness.Processes()
    try:
        with (
            harness.bounded(args.timeout),
            harness.workdir(args.keep) as directory,
            harness.store_url("sqlite", directory) as db_url,
        ):
            server = harness.start_server(processes, db_url, directory)
            from corral.client import Client

            with Client(server.url) as client:
                client.submit_batch([{"command": f"true {index}"} for index in range(args.jobs)])
            runs = commands(server.url)
            for command in runs.values():  # once each first: compiled bytecode, a warm page cache
                time_once(command, environment)
            timings: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
            for _ in range(args.runs):
                for label, command in runs.items():
                    timings[label].append(time_once(command, environment))
            processes.stop_all()
        harness.banner(f"CLI start-up ({args.src}): median of {args.runs} runs each, start to exit")
        bare = statistics.median(wall for wall, _ in timings["python -c pass"])
        for label, values in timings.items():
            wall = statistics.median(value[0] for value in values)
            cpu = statistics.median(value[1] for value in values)
            if label == "python -c pass":
                print(f"  {label:<24} {wall:7.1f} ms wall, {cpu:6.1f} ms CPU (the interpreter alone)")
                continue
            verdict = "PASS" if wall < TARGET_MS else "BELOW"
            print(
                f"  {label:<24} {wall:7.1f} ms wall, {cpu:6.1f} ms CPU; corral's own {wall - bare:6.1f} ms"
                f"  target < {TARGET_MS:.0f} ms: {verdict}"
            )
        print(f"  load average after: {harness.load_average()}")
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
