"""``corral workers``: each worker's state and load; ``--dead`` keeps those flagged dead."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect

HEADERS = ("ID", "STATUS", "GPUS", "CPUS", "MEM", "LAST-HEARTBEAT", "RUNNING")


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "workers",
        parents=[parent],
        help="list workers",
        description="List workers. GPUS, CPUS and MEM (MB) are used/total.",
    )
    parser.add_argument("--dead", action="store_true", help="only workers flagged dead (flagged_dead_at set)")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        items = client.workers()
    if arguments.dead:
        items = [worker for worker in items if worker.get("flagged_dead_at")]
    if arguments.json:
        output.print_json({"items": items})
        return exit_codes.OK
    output.print_table(HEADERS, [_row(worker) for worker in items])
    return exit_codes.OK


def _row(worker: dict[str, Any]) -> list[str]:
    used, total = worker["used"], worker["resources"]
    status = worker["status"] + (" (dead)" if worker.get("flagged_dead_at") else "")
    return [
        worker["id"],
        status,
        f"{used['gpus']}/{total['gpus']}",
        f"{used['cpus']}/{total['cpus']}",
        f"{used['memory_mb']}/{total['memory_mb']}",
        output.short_time(worker["last_heartbeat_at"]),
        str(len(worker["running"])),
    ]
