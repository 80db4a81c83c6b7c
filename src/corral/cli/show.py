"""``corral show ID``: every field of one job, one per line; a gang (``g-…``) or an array
(``a-…``): its status or counts, then its tasks as ``corral jobs`` lists them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.cli import exit_codes, jobs, output
from corral.cli.options import HANDLE_HELP, add_json_flag, connect, handle_kind

# Fields shown as key=value pairs rather than JSON.
_PAIRED = ("resources", "constraints", "env", "progress")
#: an array's tasks ``show`` lists (the first ones by index; ``corral jobs --array A --all`` has all)
ARRAY_TASKS_SHOWN = 100


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "show",
        parents=[parent],
        help="every field of a job (or a gang, an array)",
        description="Show a job, a gang (g-…: its tasks) or an array (a-…: its counts and first tasks).",
    )
    parser.add_argument("job", metavar="ID", help=HANDLE_HELP)
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    kind = handle_kind(arguments.job)
    with connect(arguments) as client:
        if kind == "gang":
            answer: dict[str, Any] = client.request_json("GET", f"/gangs/{arguments.job}")
        elif kind == "array":
            answer = client.request_json(
                "GET", f"/arrays/{arguments.job}", params={"limit": ARRAY_TASKS_SHOWN}
            )
        else:
            answer = client.request_json("GET", f"/jobs/{arguments.job}")
    if arguments.json:
        output.print_json(answer)
    elif kind == "gang":
        print(f"gang_id: {answer['gang_id']}\nsize: {answer['size']}\nstatus: {answer['status']}\n")
        output.print_table(jobs.HEADERS, [jobs.row(task) for task in answer["tasks"]])
    elif kind == "array":
        print_array(answer)
    else:
        print_fields(answer)
    return exit_codes.OK


def print_array(array: dict[str, Any]) -> None:
    """An array's size, throttle and counts, then its first tasks with their index."""
    counts = output.counts_text(array["counts"])
    print(f"array_id: {array['array_id']}\nsize: {array['size']}")
    print(f"throttle: {output.cell(array.get('throttle'))}\ncounts: {counts}\n")
    tasks = array["tasks"]
    output.print_table(
        ("INDEX", *jobs.HEADERS), [[str(task.get("array_index")), *jobs.row(task)] for task in tasks]
    )
    if len(tasks) < array["size"]:
        note = (
            f"(first {len(tasks)} tasks shown: corral jobs --array {array['array_id']} --all for every one)"
        )
        print(note, file=sys.stderr)


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
