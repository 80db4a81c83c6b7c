"""``corral events JOB``: a job's transitions, oldest first: the story ``why`` summarises.

Given a gang id (``g-…``), every task's transitions in one story, each row naming its task."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect

HEADERS = ("AT", "FROM", "TO", "REASON", "WORKER", "ATTEMPT", "EPOCH")
_REASON_WIDTH = 70


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser("events", parents=[parent], help="a job's (or a gang's) status changes")
    parser.add_argument("job", metavar="JOB", help="job id (j-…) or gang id (g-…)")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    gang = arguments.job.startswith("g-")
    with connect(arguments) as client:
        items = client.gang_events(arguments.job) if gang else client.events(arguments.job)
    if arguments.json:
        output.print_json({"items": items})
        return exit_codes.OK
    rows = [
        [
            *([output.cell(event.get("job_id"))] if gang else []),
            output.short_time(event.at),
            output.cell(event.from_status),
            event.to,
            output.truncate(output.reason_text(event.reason), _REASON_WIDTH),
            output.cell(event.worker_id),
            output.cell(event.attempt),
            output.cell(event.epoch),
        ]
        for event in items
    ]
    output.print_table(("JOB", *HEADERS) if gang else HEADERS, rows)
    return exit_codes.OK
