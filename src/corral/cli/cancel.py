"""``corral cancel ID [ID...]``: cancel each job (or gang, ``g-…``, or array, ``a-…``) and say
what happened.

A job that was waiting is ``cancelled`` at once; a running one is being stopped on its worker
(SIGTERM, the grace, SIGKILL) and ends ``cancelled`` when it has stopped: the server calls that
state ``preempting``, which is not what a user who cancelled expects to read, so it is said in words.

One refusal (already terminal, unknown id) does not stop the others: each is reported on stderr and
the exit code is 1 when any was refused. An unreachable server still stops at once (exit 3).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.cli import exit_codes
from corral.cli.options import HANDLE_HELP, connect, handle_kind
from corral.client_errors import ApiError


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "cancel",
        parents=[parent],
        help="cancel jobs (or gangs, arrays)",
        description="Cancel jobs, gangs or arrays (every task not ended); a running job is stopped first. "
        "Cancelling a gang task cancels the gang.",
    )
    parser.add_argument("jobs", nargs="+", metavar="ID", help=HANDLE_HELP)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    code = exit_codes.OK
    with connect(arguments) as client:
        for handle in arguments.jobs:
            kind = handle_kind(handle)
            try:
                if kind == "gang":
                    gang = client.request_json("POST", f"/gangs/{handle}/cancel")
                    print(said_of_gang(handle, [task["status"] for task in gang["tasks"]]))
                elif kind == "array":
                    array = client.request_json("POST", f"/arrays/{handle}/cancel")
                    print(said_of_array(handle, array["counts"]))
                else:
                    job = client.request_json("POST", f"/jobs/{handle}/cancel")
                    print(said_of_job(handle, job["status"], job.get("worker_id"), job.get("gang_id")))
            except ApiError as error:
                print(f"corral: {error.code}: {error.message}", file=sys.stderr)
                code = exit_codes.REFUSED
    return code


def said_of_job(job_id: str, status: str, worker_id: str | None, gang_id: str | None) -> str:
    """``j-1: cancelled``, or ``j-1: cancelling: stopping it on w1; ...`` while it stops."""
    with_gang = f" (with its gang {gang_id})" if gang_id else ""
    if status == "cancelled":
        return f"{job_id}: cancelled{with_gang}"
    if status in ("preempting", "running"):
        where = f" on {worker_id}" if worker_id else ""
        return f"{job_id}: cancelling{with_gang}: stopping it{where}; it ends cancelled once it has stopped"
    return f"{job_id}: {status}{with_gang}"


def said_of_gang(gang_id: str, statuses: list[str]) -> str:
    """``g-1: cancelled (4 tasks)``, or how many of its tasks are still stopping."""
    stopping = sum(1 for status in statuses if status in ("preempting", "running"))
    if stopping:
        return (
            f"{gang_id}: cancelling: stopping {stopping} running task(s) of {len(statuses)}; "
            "the gang ends cancelled once they have stopped"
        )
    return f"{gang_id}: cancelled ({len(statuses)} tasks)"


def said_of_array(array_id: str, counts: dict[str, int]) -> str:
    """``a-1: cancelled (8 tasks; 2 had ended)``, or how many of its tasks are still stopping
    (running ones are stopped first: the server calls that ``preempting``, said here in words)."""
    size = sum(counts.values())
    stopping = counts.get("preempting", 0) + counts.get("running", 0)
    ended = size - counts.get("cancelled", 0) - stopping  # done or failed before the cancel
    before = f"; {ended} had ended" if ended else ""
    if stopping:
        return (
            f"{array_id}: cancelling: stopping {stopping} running task(s) of {size}{before}; "
            "they end cancelled once they have stopped"
        )
    return f"{array_id}: cancelled ({size} tasks{before})"
