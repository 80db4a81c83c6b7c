"""``corral why ID``: the status and the server's reasons, best first, as ``code: message``.

Given a gang id (``g-…``), the gang's status and the reasons of the task that tells its story (the
failed one, else one still waiting: every waiting task waits for the same admission); given an
array id (``a-…``), its counts by status and, likewise, the reasons of its most telling task."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import HANDLE_HELP, add_json_flag, connect, handle_kind

_ROUTES = {"job": "/jobs/{}/why", "gang": "/gangs/{}/why", "array": "/arrays/{}/why"}


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser("why", parents=[parent], help="why a job (or gang, array) is not running")
    parser.add_argument("job", metavar="ID", help=HANDLE_HELP)
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    kind = handle_kind(arguments.job)
    with connect(arguments) as client:
        answer: dict[str, Any] = client.request_json("GET", _ROUTES[kind].format(arguments.job))
    if arguments.json:
        output.print_json(answer)
        return exit_codes.OK
    told = answer.get("job_id")
    counts = answer.get("counts")
    shown = (
        f" ({', '.join(f'{count} {status}' for status, count in sorted(counts.items()))})" if counts else ""
    )
    of_task = f" (reasons of task {told})" if kind != "job" and told else ""
    print(f"{arguments.job}: {answer['status']}{shown}{of_task}")
    for reason in answer["reasons"]:
        print(f"  {output.reason_text(reason)}")
    return exit_codes.OK
