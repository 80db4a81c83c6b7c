"""``corral events ID``: a job's transitions, oldest first: the story ``why`` summarises.

Given a gang id (``g-…``) or an array id (``a-…``), every task's transitions in one story, each
row naming its task."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import HANDLE_HELP, add_json_flag, connect, handle_kind

HEADERS = ("AT", "FROM", "TO", "REASON", "WORKER", "ATTEMPT", "EPOCH")
_REASON_WIDTH = 70
_ROUTES = {"job": "/jobs/{}/events", "gang": "/gangs/{}/events", "array": "/arrays/{}/events"}


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "events", parents=[parent], help="a job's (or gang's, array's) status changes"
    )
    parser.add_argument("job", metavar="ID", help=HANDLE_HELP)
    parser.add_argument("--wide", action="store_true", help="reasons in full (they are cut otherwise)")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    kind = handle_kind(arguments.job)
    with connect(arguments) as client:
        items: list[dict[str, Any]] = client.request_json("GET", _ROUTES[kind].format(arguments.job))["items"]
    if arguments.json:
        output.print_json({"items": items})
        return exit_codes.OK
    width = 10**9 if arguments.wide else _REASON_WIDTH
    tasks = kind != "job"
    rows = [
        [
            *([output.cell(event.get("job_id"))] if tasks else []),
            output.short_time(event["at"]),
            output.cell(event.get("from")),
            event["to"],
            output.truncate(output.reason_text(event.get("reason")), width),
            output.cell(event.get("worker_id")),
            output.cell(event.get("attempt")),
            output.cell(event.get("epoch")),
        ]
        for event in items
    ]
    output.print_table(("JOB", *HEADERS) if tasks else HEADERS, rows)
    return exit_codes.OK
