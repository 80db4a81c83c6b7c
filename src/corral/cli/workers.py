"""``corral workers``: each worker's state and load; ``--dead`` keeps those flagged dead.

``corral workers drain ID`` stops placing work on a worker (its running jobs finish);
``corral workers undrain ID`` lets it take work again; ``corral workers remove ID`` forgets an
offline worker (one that was stopped or went silent, and holds no job). All three need an admin
token when the server has authentication on.
"""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect
from corral.protocol.answers import GpuStatAnswer, WorkerAnswer

HEADERS = ("ID", "STATUS", "GPUS", "GPU-UTIL", "CPUS", "MEM", "LAST-HEARTBEAT", "RUNNING", "ENFORCEMENT")


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "workers",
        parents=[parent],
        help="list workers; drain, undrain or remove one",
        description=(
            "List workers. GPUS, CPUS and MEM (MB) are used/total; GPU-UTIL is the utilisation of each "
            "GPU as the worker's last heartbeat read it (- without a GPU sampler). When workers carry "
            "topology labels (CORRAL_TOPOLOGY_LEVELS), they are grouped by them: TOPOLOGY is "
            "block/rack (- for a level the worker lacks)."
        ),
    )
    parser.add_argument("--dead", action="store_true", help="only workers flagged dead (flagged_dead_at set)")
    add_json_flag(parser)
    parser.set_defaults(run=run)
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=False)
    for name, help_text in (
        ("drain", "stop placing work on a worker; its running jobs finish (admin)"),
        ("undrain", "let a drained worker take work again (admin)"),
    ):
        action = actions.add_parser(name, parents=[parent], help=help_text, description=help_text)
        action.add_argument("worker_id", metavar="ID", help="the worker's id")
        add_json_flag(action)
        action.set_defaults(run=run_drain, action=name)
    remove_help = "forget an offline worker that holds no job (admin); a running one is refused"
    remove = actions.add_parser("remove", parents=[parent], help=remove_help, description=remove_help)
    remove.add_argument("worker_id", metavar="ID", help="the worker's id")
    remove.set_defaults(run=run_remove)


def run_remove(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        client.remove_worker(arguments.worker_id)
    print(f"{arguments.worker_id} removed")
    return exit_codes.OK


def run_drain(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        if arguments.action == "drain":
            worker = client.drain_worker(arguments.worker_id)
        else:
            worker = client.undrain_worker(arguments.worker_id)
    if arguments.json:
        output.print_json(worker)
    else:
        print(f"{worker.id} {worker.status}")
    return exit_codes.OK


def run(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        page = client.worker_page()
    items, levels = page.items, page.topology_levels
    if arguments.dead:
        items = [worker for worker in items if worker.flagged_dead_at]
    if arguments.json:
        output.print_json({"items": items})
        return exit_codes.OK
    if not any(level in worker.labels for worker in items for level in levels):
        output.print_table(HEADERS, [_row(worker) for worker in items])
        return exit_codes.OK
    # grouped by topology (API.md "Topology"): the widest level first, then the worker's id
    items = sorted(items, key=lambda worker: (_path(worker, levels), worker.id))
    output.print_table(
        ("TOPOLOGY", *HEADERS), [[_topology(worker, levels), *_row(worker)] for worker in items]
    )
    return exit_codes.OK


def _path(worker: WorkerAnswer, levels: list[str]) -> tuple[str, ...]:
    return tuple(worker.labels.get(level, "") for level in levels)


def _topology(worker: WorkerAnswer, levels: list[str]) -> str:
    """``b1/r07``: the worker's label at each topology level, widest first (``-`` for one it lacks)."""
    return "/".join(value or output.MISSING for value in _path(worker, levels))


def _row(worker: WorkerAnswer) -> list[str]:
    used, total = worker.used, worker.resources
    status = worker.status + (" (dead)" if worker.flagged_dead_at else "")
    return [
        worker.id,
        status,
        f"{used.gpus}/{total.gpus}",
        _utilisation(worker.gpu_stats),
        f"{used.cpus}/{total.cpus}",
        f"{used.memory_mb}/{total.memory_mb}",
        output.short_time(worker.last_heartbeat_at),
        str(len(worker.running)),
        _enforcement(worker.enforcement),
    ]


def _enforcement(enforcement: dict[str, str]) -> str:
    """``identity=setuid,memory=cgroup_v1,...`` less what is ``none``; ``none`` when nothing is
    enforced, ``-`` for a worker that never said."""
    if not enforcement:
        return output.MISSING
    held = [f"{key}={value}" for key, value in enforcement.items() if value != "none"]
    return ",".join(held) or "none"


def _utilisation(readings: list[GpuStatAnswer]) -> str:
    """``87,0,12%`` by GPU index; ``-`` when the worker reports none."""
    values = [reading.util_pct for reading in sorted(readings, key=lambda reading: reading.index)]
    if not values or all(value is None for value in values):
        return output.MISSING
    return ",".join("?" if value is None else f"{value:.0f}" for value in values) + "%"
