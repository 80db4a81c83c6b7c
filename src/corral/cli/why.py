"""``corral why JOB``: the job's status and the server's reasons, best first, as ``code: message``."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "why", parents=[parent], help="why a job is not running (or why it ended)"
    )
    parser.add_argument("job", metavar="JOB", help="job id")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        answer = client.why(arguments.job)
    if arguments.json:
        output.print_json(answer)
        return exit_codes.OK
    print(f"{arguments.job}: {answer.status}")
    for reason in answer.reasons:
        print(f"  {output.reason_text(reason)}")
    return exit_codes.OK
