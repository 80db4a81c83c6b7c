"""``corral why JOB``: the job's status and the server's reasons, best first, as ``code: message``.

Given a gang id (``g-…``), the gang's status and the reasons of the task that tells its story (the
failed one, else one still waiting: every waiting task waits for the same admission)."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "why", parents=[parent], help="why a job is not running (or why it ended)"
    )
    parser.add_argument("job", metavar="JOB", help="job id (j-…) or gang id (g-…)")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    gang = arguments.job.startswith("g-")
    with connect(arguments) as client:
        answer = client.gang_why(arguments.job) if gang else client.why(arguments.job)
    if arguments.json:
        output.print_json(answer)
        return exit_codes.OK
    told = answer.get("job_id")
    print(f"{arguments.job}: {answer.status}" + (f" (reasons of task {told})" if gang and told else ""))
    for reason in answer.reasons:
        print(f"  {output.reason_text(reason)}")
    return exit_codes.OK
