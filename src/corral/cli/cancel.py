"""``corral cancel JOB [JOB...]``: cancel each job (or gang, ``g-…``) and print its new status.

One refusal (already terminal, unknown id) does not stop the others: each is reported on stderr and
the exit code is 1 when any was refused. An unreachable server still stops at once (exit 3).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.cli import exit_codes
from corral.cli.options import connect
from corral.client import ApiError


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "cancel",
        parents=[parent],
        help="cancel jobs",
        description="Cancel jobs; a running job is stopped first. Cancelling a gang task cancels the gang.",
    )
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="job id (j-…) or gang id (g-…)")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    code = exit_codes.OK
    with connect(arguments) as client:
        for job_id in arguments.jobs:
            try:
                if job_id.startswith("g-"):
                    print(f"{job_id}: {client.cancel_gang(job_id).status}")
                else:
                    print(f"{job_id}: {client.cancel(job_id).status}")
            except ApiError as error:
                print(f"corral: {error.code}: {error.message}", file=sys.stderr)
                code = exit_codes.REFUSED
    return code
