"""``corral jobs``: the job list, newest first, the active jobs by default (as ``squeue`` shows them).

Active means not ended (not ``done``, ``failed`` or ``cancelled``); ``--status`` picks statuses
instead (``pending`` also names the tasks of waiting gangs, which are ``blocked``), and ``--all``
shows every status and every page (followed through the cursor in pages of ``_ALL_PAGE_SIZE``).
Without ``--all`` one page of ``--limit`` rows is shown and a note on stderr says when more exist.
``--json`` prints ``{"items": [...], "next": cursor}`` like the API, with ``--all`` or without.

The answers are read as plain JSON data, not into the SDK's models, so the command starts without
pydantic (issue 23).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect
from corral.domain.status import NON_TERMINAL, Status

if TYPE_CHECKING:
    from corral.client import Client

HEADERS = ("ID", "STATUS", "USER", "ATTEMPTS", "GPUS", "WORKER", "SUBMITTED", "NAME/COMMAND", "REASON")
#: ``--start`` (like ``squeue --start``): the waiting jobs with their planned start and workers
START_HEADERS = ("ID", "STATUS", "GPUS", "SUBMITTED", "ESTIMATED START", "PLANNED WORKERS", "NAME/COMMAND")
_ALL_PAGE_SIZE = 1000
_COMMAND_WIDTH = 40
_REASON_WIDTH = 50
#: the statuses a plain ``corral jobs`` lists, in their lifecycle order
ACTIVE = tuple(status.value for status in Status if status in NON_TERMINAL)


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "jobs",
        parents=[parent],
        help="list jobs",
        description=(
            "List jobs, newest first: those not ended (pending, blocked, reserved, running, preempting, "
            "preempted) unless --status or --all says otherwise."
        ),
    )
    parser.add_argument(
        "--status",
        help="comma list: pending,running,done,... (pending also lists the blocked tasks of waiting gangs)",
    )
    parser.add_argument("--gang", metavar="GANG_ID", help="tasks of this gang")
    parser.add_argument("--pool", help="jobs of this pool")
    parser.add_argument("--array", metavar="ARRAY_ID", help="tasks of this array")
    parser.add_argument("--worker", metavar="WORKER_ID", help="jobs placed on this worker")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--user", metavar="NAME", help="jobs of this user")
    who.add_argument(
        "--mine", action="store_true", help="jobs of $USER (the user `corral submit` sends by default)"
    )
    parser.add_argument("--oldest", action="store_true", help="oldest first (the API's default order)")
    parser.add_argument("--limit", type=int, default=50, help="rows in one page (default 50)")
    parser.add_argument(
        "--all",
        action="store_true",
        help="every status (unless --status) and every page (follows the cursor)",
    )
    parser.add_argument(
        "--start",
        action="store_true",
        help="waiting jobs (pending, blocked): their ESTIMATED START and planned workers (squeue --start)",
    )
    parser.add_argument(
        "--wide", action="store_true", help="every cell in full (reasons and commands are cut otherwise)"
    )
    add_json_flag(parser)
    parser.set_defaults(run=run)


def statuses(arguments: argparse.Namespace) -> str | None:
    """The ``status`` filter sent: the statuses asked for, with ``blocked`` beside ``pending`` (a
    waiting gang's tasks wait as ``blocked``); the active ones when none were asked for, none with
    ``--all``."""
    if not arguments.status and getattr(arguments, "start", False):
        return "pending,blocked"
    if arguments.status:
        asked = [part for part in arguments.status.split(",") if part]
        if "pending" in asked and "blocked" not in asked:
            asked.insert(asked.index("pending") + 1, "blocked")
        return ",".join(asked)
    return None if arguments.all else ",".join(ACTIVE)


def filters(arguments: argparse.Namespace) -> dict[str, Any]:
    user = arguments.user
    if arguments.mine:
        user = os.environ.get("USER") or os.environ.get("LOGNAME")
    return {
        "status": statuses(arguments),
        "gang_id": arguments.gang,
        "pool": arguments.pool,
        "worker_id": arguments.worker,
        "user": user,
        "order": "oldest" if arguments.oldest else "newest",
        "array_id": arguments.array,
    }


def run(arguments: argparse.Namespace) -> int:
    wanted = filters(arguments)
    with connect(arguments) as client:
        if arguments.all:
            page: dict[str, Any] = {"items": list(every_job(client, wanted)), "next": None}
        else:
            page = _page(client, wanted, arguments.limit, None)
    if arguments.json:
        output.print_json(page)
        return exit_codes.OK
    if arguments.start:
        output.print_table(START_HEADERS, [start_row(job, arguments.wide) for job in page["items"]])
    else:
        output.print_table(HEADERS, [row(job, arguments.wide) for job in page["items"]])
    if page["next"]:
        print(f"(first {len(page['items'])} jobs shown: --all for every one)", file=sys.stderr)
    return exit_codes.OK


def every_job(client: Client, wanted: dict[str, Any]) -> Iterator[dict[str, Any]]:
    after = None
    while True:
        page = _page(client, wanted, _ALL_PAGE_SIZE, after)
        yield from page["items"]
        after = page["next"]
        if not after:
            return


def _page(client: Client, wanted: dict[str, Any], limit: int, after: str | None) -> dict[str, Any]:
    params = {key: value for key, value in wanted.items() if value is not None}
    params["limit"] = limit
    if after:
        params["after"] = after
    page: dict[str, Any] = client.request_json("GET", "/jobs", params=params)
    return page


def _cut(text: str | None, width: int, wide: bool) -> str:
    """A cell cut to ``width`` on one line, or, with ``--wide``, whole (still on one line)."""
    return output.truncate(text, 10**9 if wide else width)


def row(job: Any, wide: bool = False) -> list[str]:
    """A table row of a job: plain JSON data or a ``JobAnswer`` (both read by item); ``wide``:
    the command and the reason in full."""
    attempts, attempt = job.get("attempts") or 0, job.get("attempt") or 0
    reason = job.get("reason")
    return [
        job["id"],
        job["status"],
        output.cell(job.get("user")),
        # counted attempts, and the run number when a refund made them differ
        str(attempts) if attempt in (0, attempts) else f"{attempts} (run {attempt})",
        str((job.get("resources") or {}).get("gpus", 0)),
        output.cell(job.get("worker_id")),
        output.short_time(job.get("submitted_at")),
        _cut(job.get("name") or job["command"], _COMMAND_WIDTH, wide),
        _cut(output.reason_text(reason), _REASON_WIDTH, wide) if reason else output.MISSING,
    ]


def start_row(job: Any, wide: bool = False) -> list[str]:
    """A waiting job's planned start (``-`` without a reservation: no known start)."""
    return [
        job["id"],
        job["status"],
        str((job.get("resources") or {}).get("gpus", 0)),
        output.short_time(job.get("submitted_at")),
        output.short_time(job.get("estimated_start_at")),
        ",".join(job.get("planned_workers") or []) or output.MISSING,
        _cut(job.get("name") or job["command"], _COMMAND_WIDTH, wide),
    ]
