"""``corral jobs``: the job list, in the API's order (submission time, then id).

By default one page of ``--limit`` rows is shown and a note on stderr says when more exist; ``--all``
follows the cursor through every page (in pages of ``_ALL_PAGE_SIZE``, since late pages may be big).
``--json`` prints ``{"items": [...], "next": cursor}`` like the API, with ``--all`` or without.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect
from corral.protocol.answers import JobAnswer, JobPage

HEADERS = ("ID", "STATUS", "ATTEMPTS", "GPUS", "WORKER", "SUBMITTED", "NAME/COMMAND", "REASON")
#: ``--start`` (like ``squeue --start``): the waiting jobs with their planned start and workers
START_HEADERS = ("ID", "STATUS", "GPUS", "SUBMITTED", "ESTIMATED START", "PLANNED WORKERS", "NAME/COMMAND")
_ALL_PAGE_SIZE = 1000
_COMMAND_WIDTH = 40
_REASON_WIDTH = 50


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "jobs", parents=[parent], help="list jobs", description="List jobs, oldest first (the API's order)."
    )
    parser.add_argument("--status", help="comma list: pending,running,...")
    parser.add_argument("--gang", metavar="GANG_ID", help="tasks of this gang")
    parser.add_argument("--pool", help="jobs of this pool")
    parser.add_argument("--worker", metavar="WORKER_ID", help="jobs placed on this worker")
    parser.add_argument("--limit", type=int, default=50, help="rows in one page (default 50)")
    parser.add_argument("--all", action="store_true", help="every job: follow the cursor through every page")
    parser.add_argument(
        "--start",
        action="store_true",
        help="waiting jobs (pending, blocked): their ESTIMATED START and planned workers (squeue --start)",
    )
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    filters = {
        "status": arguments.status or ("pending,blocked" if arguments.start else None),
        "gang_id": arguments.gang,
        "pool": arguments.pool,
        "worker_id": arguments.worker,
    }
    with connect(arguments) as client:
        if arguments.all:
            page = JobPage(items=list(client.iter_jobs(page_size=_ALL_PAGE_SIZE, **filters)), next=None)
        else:
            page = client.list_jobs_page(limit=arguments.limit, **filters)
    if arguments.json:
        output.print_json(page)
        return exit_codes.OK
    if arguments.start:
        output.print_table(START_HEADERS, [start_row(job) for job in page.items])
    else:
        output.print_table(HEADERS, [row(job) for job in page.items])
    if page.next:
        print(f"(first {len(page.items)} jobs shown: --all for every one)", file=sys.stderr)
    return exit_codes.OK


def row(job: JobAnswer) -> list[str]:
    return [
        job.id,
        job.status,
        # counted attempts, and the run number when a refund made them differ
        str(job.attempts) if job.attempt in (0, job.attempts) else f"{job.attempts} (run {job.attempt})",
        str(job.resources.gpus),
        output.cell(job.worker_id),
        output.short_time(job.submitted_at),
        output.truncate(job.name or job.command, _COMMAND_WIDTH),
        output.truncate(output.reason_text(job.reason), _REASON_WIDTH) if job.reason else output.MISSING,
    ]


def start_row(job: JobAnswer) -> list[str]:
    """A waiting job's planned start (``-`` without a reservation: no known start)."""
    return [
        job.id,
        job.status,
        str(job.resources.gpus),
        output.short_time(job.submitted_at),
        output.short_time(job.estimated_start_at),
        ",".join(job.planned_workers) or output.MISSING,
        output.truncate(job.name or job.command, _COMMAND_WIDTH),
    ]
