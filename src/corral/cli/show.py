"""``corral show JOB``: every field of one job (or of a gang, given a ``g-…`` id), one per line."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, jobs, output
from corral.cli.options import add_json_flag, connect
from corral.protocol.answers import GangAnswer, JobAnswer

# Fields shown as key=value pairs rather than JSON.
_PAIRED = ("resources", "constraints", "env", "progress")


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "show",
        parents=[parent],
        help="every field of a job (or a gang)",
        description="Show a job (or a gang: g-…).",
    )
    parser.add_argument("job", metavar="JOB", help="job id (j-…) or gang id (g-…)")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    answer: GangAnswer | JobAnswer
    with connect(arguments) as client:
        if arguments.job.startswith("g-"):
            answer = client.gang(arguments.job)
        else:
            answer = client.get_job(arguments.job)
    if arguments.json:
        output.print_json(answer)
    elif isinstance(answer, GangAnswer):
        print(f"gang_id: {answer.gang_id}\nsize: {answer.size}\nstatus: {answer.status}\n")
        output.print_table(jobs.HEADERS, [jobs.row(task) for task in answer.tasks])
    else:
        print_fields(answer.to_wire())
    return exit_codes.OK


def print_fields(job: dict[str, Any]) -> None:
    """``field: value`` aligned; multi-line text (output tails) indented under its field."""
    width = max(len(key) for key in job)
    for key, value in job.items():
        if key in _PAIRED:
            text = output.pairs(value)
        elif key == "reason":
            text = output.reason_text(value)
        elif isinstance(value, list):
            text = ", ".join(str(item) for item in value) or output.MISSING
        elif isinstance(value, str) and "\n" in value:
            text = "\n" + "\n".join("    " + line for line in value.rstrip("\n").splitlines())
        else:
            text = output.cell(value)
        print(f"{key + ':':<{width + 1}} {text}")
