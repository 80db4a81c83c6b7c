"""``corral sim``: replay a workload through corral's own core on a simulated clock (no server).

``corral sim WORKLOAD [--cluster CLUSTER] [--pools POOLS | --assign-pools QUOTAS --seed N]
[--walltime-factor F] [--policy corral|fifo|corral,fifo] [--set CORRAL_NAME=VALUE ...] [--out DIR]
[--json]``, ``corral sim generate DIR --trace JOBS.csv --quotas QUOTAS.csv [--walltime-factor F]`` and
``corral sim compare A.json B.json``. Bad input stops the command before anything runs, with the
file, line and column (exit 2).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from corral.cli import exit_codes, output
from corral.config import ServerSettings, WorkerSettings
from corral.sim import engine, readers, synthetic
from corral.sim.compare import table
from corral.sim.policy import POLICIES
from corral.sim.summary import summarize
from corral.sim.workload import Scenario, SimSettings

DESCRIPTION = """\
Replay a workload through corral's scheduling core (the admission cycle, the preemption planner,
the claim and every job transition the server applies) on a simulated clock, and print queueing
delay, completion time, GPU allocation, preemptions and per-pool fairness.

WORKLOAD is a CSV (job_id, submit_time, duration, gpus, ...; see the README) or the Alibaba GPU
trace's jobs.csv as it is (its node list beside it is the default cluster). `corral sim compare
A.json B.json` prints two --json summaries side by side."""


class UsageError(Exception):
    pass


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "sim",
        help="simulate a workload on a cluster with corral's own core",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="WORKLOAD", help="workload CSV, or: compare A.json B.json"
    )
    parser.add_argument(
        "--cluster", help="cluster CSV (worker_id, gpus, cpus, memory_mb, vram_mb, gpu_model, count)"
    )
    parser.add_argument("--pools", help='pools JSON: {"pools": {"<path>": {<PUT /pools body>}}}')
    parser.add_argument(
        "--assign-pools",
        metavar="QUOTAS",
        help="assign jobs to pools in proportion to the Helios Venus quotas (cluster_gpu_number.csv)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of --assign-pools (default 1)")
    parser.add_argument(
        "--walltime-factor",
        type=_factor,
        metavar="F",
        help="give every job without a walltime one of its runtime x F, rounded up to the next 15"
        " minutes (the traces have none; users over-ask in round steps); with generate: written"
        " into workload.csv",
    )
    parser.add_argument(
        "--policy", default="corral", help="corral, fifo, or several joined by commas (default corral)"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="CORRAL_NAME=VALUE",
        help="change a setting (e.g. CORRAL_ADMISSION_TICK_S=10, CORRAL_MAX_VICTIMS=1); repeatable",
    )
    parser.add_argument("--out", help="write report.html, its PNGs and summary JSON files in this folder")
    generate = parser.add_argument_group(
        "generate DIR --trace JOBS.csv --quotas QUOTAS.csv: write a multi-tenant workload.csv,"
        " cluster.csv and pools.json built from the shared traces (corral.sim.synthetic)"
    )
    generate.add_argument("--trace", help="the Alibaba trace's jobs.csv (arrivals and runtimes)")
    generate.add_argument("--quotas", help="the Helios Venus cluster_gpu_number.csv (pools and quotas)")
    generate.add_argument("--jobs", type=int, default=3000, help="jobs to generate (default 3000)")
    generate.add_argument("--workers", type=int, default=64, help="workers of 8 GPUs (default 64)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON (no progress bar)")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    try:
        if arguments.inputs[0] == "compare":
            return _compare(arguments.inputs[1:])
        if arguments.inputs[0] == "generate":
            return _generate(arguments)
        if len(arguments.inputs) != 1:
            raise UsageError("expected one WORKLOAD (or: compare A.json B.json)")
        scenario = scenario_from(arguments)
        policies = [name.strip() for name in arguments.policy.split(",") if name.strip()]
        for name in policies:
            if name not in POLICIES:
                raise UsageError(f"--policy {name}: expected one of {', '.join(POLICIES)}")
    except (readers.InputError, UsageError) as error:
        print(f"corral sim: {error}", file=sys.stderr)
        return exit_codes.USAGE
    summaries: list[dict[str, Any]] = []
    records = {}
    for name in policies:
        progress = _progress_bar(name)
        started = time.perf_counter()
        record = engine.run(scenario, POLICIES[name], progress)
        elapsed = time.perf_counter() - started
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        summaries.append(summarize(scenario, record, name, elapsed))
        records[name] = record
    if arguments.out:
        out = Path(arguments.out)
        out.mkdir(parents=True, exist_ok=True)
        for summary in summaries:
            (out / f"summary-{summary['policy']}.json").write_bytes(
                orjson.dumps(summary, option=orjson.OPT_INDENT_2)
            )
        from corral.sim import report  # matplotlib is an optional dependency: only --out needs it

        page = report.write(out, scenario, records, summaries)
        if not arguments.json:
            print(f"report: {page}", file=sys.stderr)
    if arguments.json:
        document: Any = summaries[0] if len(summaries) == 1 else {s["policy"]: s for s in summaries}
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        headers, rows = table(summaries)
        output.print_table(headers, rows)
        unscheduled = summaries[0].get("unscheduled_in_production")
        if unscheduled:
            print(f"({unscheduled} trace jobs never scheduled in production: not replayed)")
    return exit_codes.OK


def scenario_from(arguments: argparse.Namespace) -> Scenario:
    workload_path = arguments.inputs[0]
    workload = readers.read_workload(workload_path)
    cluster_path = arguments.cluster or readers.alibaba_nodes_beside(workload_path)
    if cluster_path is None:
        raise UsageError("--cluster is required (only the Alibaba trace has a cluster of its own)")
    cluster = readers.read_cluster(cluster_path)
    pools = readers.read_pools(arguments.pools) if arguments.pools else {}
    if arguments.assign_pools:
        quotas = readers.venus_quotas(arguments.assign_pools)
        workload, assigned = readers.assign_pools(workload, cluster, quotas, arguments.seed)
        pools = {**assigned, **pools}
    if arguments.walltime_factor is not None:
        workload = readers.with_walltimes(workload, arguments.walltime_factor)
    return Scenario(workload, cluster, pools, settings_from(arguments.settings))


def settings_from(assignments: list[str]) -> SimSettings:
    """``CORRAL_NAME=VALUE`` pairs as the simulator's settings, each checked by the rule the
    server's (or the worker's) own setting of that name has."""
    known = {field.name: field for field in fields(SimSettings)}
    values: dict[str, str] = {}
    for item in assignments:
        name, equals, value = item.partition("=")
        key = name.strip().removeprefix("CORRAL_").lower()
        if not equals or not name.startswith("CORRAL_") or key not in known:
            raise UsageError(
                f"--set {item}: expected CORRAL_NAME=VALUE, one of "
                + ", ".join("CORRAL_" + name.upper() for name in known)
            )
        values[key] = value.strip()
    checked: dict[str, Any] = {}
    for settings_class in (ServerSettings, WorkerSettings):
        own = {key: value for key, value in values.items() if key in settings_class.model_fields}
        if not own:
            continue
        try:
            validated = settings_class.model_validate(own)
        except ValidationError as error:
            first = error.errors()[0]
            key = str(first["loc"][0])
            raise UsageError(f"--set CORRAL_{key.upper()}={values[key]}: {first['msg']}") from None
        checked.update({key: getattr(validated, key) for key in own})
    for key, value in values.items():
        if key in checked:
            continue
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--set CORRAL_{key.upper()}={value}: expected a number") from None
        if number < 0:
            raise UsageError(f"--set CORRAL_{key.upper()}={value}: expected a number >= 0")
        checked[key] = number
    return SimSettings(**checked)


def _generate(arguments: argparse.Namespace) -> int:
    if len(arguments.inputs) != 2 or not arguments.trace or not arguments.quotas:
        raise UsageError("generate: expected DIR, --trace JOBS.csv and --quotas QUOTAS.csv")
    out = Path(arguments.inputs[1])
    trace = readers.read_workload(arguments.trace)
    quotas = readers.venus_quotas(arguments.quotas)
    shape = synthetic.Shape(jobs=arguments.jobs, workers=arguments.workers)
    workload, cluster, pools = synthetic.multi_tenant(trace, quotas, shape, arguments.seed)
    if arguments.walltime_factor is not None:
        workload = readers.with_walltimes(workload, arguments.walltime_factor)
    out.mkdir(parents=True, exist_ok=True)
    synthetic.write_csv(workload, str(out / "workload.csv"))
    (out / "cluster.csv").write_text(f"worker_id,gpus,count\nw,{shape.gpus_per_worker},{shape.workers}\n")
    document = {
        "pools": {
            path: {"weight": settings.weight, "guarantee": settings.guarantee.to_dict()}
            for path, settings in pools.items()
            if settings.guarantee is not None
        }
    }
    (out / "pools.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    heavy = ", ".join(synthetic.heavy_pools(pools, shape.heavy))
    print(f"{out}: {len(workload.jobs)} jobs, {cluster.gpus} GPUs, {len(pools)} pools (overloaded: {heavy})")
    return exit_codes.OK


def _factor(text: str) -> float:
    """``--walltime-factor``: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _compare(paths: list[str]) -> int:
    if len(paths) < 2:
        raise UsageError("compare: expected two or more summary JSON files (corral sim ... --json)")
    summaries = []
    for path in paths:
        try:
            document = orjson.loads(Path(path).read_bytes())
        except OSError as error:
            raise readers.InputError(path, None, None, f"cannot open: {error.strerror}") from None
        except orjson.JSONDecodeError as error:
            raise readers.InputError(path, None, None, f"not JSON: {error}") from None
        if not isinstance(document, dict) or "queue_delay_s" not in document:
            raise readers.InputError(path, 1, None, "not a corral sim --json summary of one policy")
        document.setdefault("policy", Path(path).stem)
        document["policy"] = f"{document['policy']} ({Path(path).name})"
        summaries.append(document)
    headers, rows = table(summaries)
    output.print_table(headers, rows)
    return exit_codes.OK


#: how often a run's progress is written when stderr is not a terminal (wall seconds)
PROGRESS_EVERY_S = 10.0


def _progress_bar(
    name: str, stream: Any = None, clock: Callable[[], float] = time.monotonic
) -> Callable[[engine.Progress], None]:
    """A run's progress on stderr: a bar redrawn in place when stderr is a terminal, else a line
    every ``PROGRESS_EVERY_S`` of wall time (jobs done and submitted, simulated time)."""
    stream = stream if stream is not None else sys.stderr
    terminal = stream.isatty()
    width = 30
    last = [-math.inf]

    def show(progress: engine.Progress) -> None:
        at = clock()
        if progress.finished:
            if last[0] == math.inf:
                return  # the end is shown once
        elif at - last[0] < (0.1 if terminal else PROGRESS_EVERY_S):
            return
        last[0] = math.inf if progress.finished else at
        fraction = progress.done / progress.total if progress.total else 1.0
        counts = (
            f"{progress.done:,}/{progress.total:,} jobs done, {progress.submitted:,} submitted,"
            f" simulated {_duration(progress.now)}"
        )
        if terminal:
            filled = int(fraction * width)
            stream.write(f"\r{name:>6} [{'#' * filled}{'.' * (width - filled)}] {counts}")
        else:
            stream.write(f"corral sim: {name}: {counts}\n")
        stream.flush()

    return show


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.0f} s"
