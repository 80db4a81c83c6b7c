"""``corral logs JOB [-f] [--attempt N]``: what a job printed (stdout and stderr, as written).

Without ``-f``, the output stored so far of the attempt (the latest by default). With ``-f``, the
output as it is written, until the attempt ends (a job that has not started yet is waited for); a
Ctrl-C stops following cleanly (exit 130). A gang id (``g-…``) shows every rank's output, each line
prefixed with ``[rank N]``, an array id (``a-…``) every task's, prefixed with ``[index N]``; with
``-f`` the tasks are followed together, line by line.

Bytes past ``CORRAL_LOG_MAX_BYTES`` per attempt were dropped by the server (the oldest first): a
note on stderr says how many.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from corral.cli import exit_codes
from corral.cli.options import HANDLE_HELP, connect, handle_kind
from corral.client import Client, LogChunk

#: how often a follow asks the server for new output
FOLLOW_POLL_S = 0.5
#: an array's tasks read per page of ``GET /jobs?array_id=``
_TASK_PAGE = 1000


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "logs",
        parents=[parent],
        help="what a job (or a gang, an array) printed",
        description="Print a job's output (stdout and stderr, interleaved as written); a gang's per rank, "
        "an array's per task.",
    )
    parser.add_argument("job", metavar="ID", help=HANDLE_HELP)
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new output until the attempt ends"
    )
    parser.add_argument("--attempt", type=int, metavar="N", help="which attempt (default: the latest)")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    if arguments.attempt is not None and arguments.attempt < 1:
        print("corral: --attempt must be 1 or more", file=sys.stderr)
        return exit_codes.USAGE
    out = sys.stdout.buffer
    kind = handle_kind(arguments.job)
    with connect(arguments) as client:
        if kind == "job":
            for chunk in _chunks(client, arguments.job, arguments.attempt, arguments.follow):
                out.write(chunk.data)
                out.flush()
            return exit_codes.OK
        tasks = _tasks(client, kind, arguments.job)
        printer = RankPrinter(out)
        if not arguments.follow:
            for prefix, task_id in tasks:
                for chunk in _chunks(client, task_id, arguments.attempt, False):
                    printer.write(prefix, chunk.data)
                printer.end(prefix)
            return exit_codes.OK
        followers = [
            threading.Thread(
                target=_follow_rank,
                args=(client, task_id, prefix, arguments.attempt, printer),
                daemon=True,
            )
            for prefix, task_id in tasks
        ]
        for follower in followers:
            follower.start()
        for follower in followers:
            while follower.is_alive():  # a timed join, so Ctrl-C reaches the main thread
                follower.join(0.2)
        if printer.error is not None:
            raise printer.error
    return exit_codes.OK


def _tasks(client: Client, kind: str, handle: str) -> list[tuple[str, str]]:
    """Each task of a gang or an array, as (its line prefix, its job id), in rank or index order."""
    if kind == "gang":
        gang = client.request_json("GET", f"/gangs/{handle}")
        return [(f"[rank {task.get('gang_index') or 0}] ", task["id"]) for task in gang["tasks"]]
    client.request_json("GET", f"/arrays/{handle}", params={"limit": 0})  # 404 for an unknown array
    tasks: list[tuple[str, str]] = []
    after = None
    while True:
        params: dict[str, Any] = {"array_id": handle, "limit": _TASK_PAGE}
        if after:
            params["after"] = after
        page = client.request_json("GET", "/jobs", params=params)
        tasks += [(f"[index {task.get('array_index')}] ", task["id"]) for task in page["items"]]
        after = page["next"]
        if not after:
            return tasks


def _chunks(client: Client, job_id: str, attempt: int | None, follow: bool) -> Iterator[LogChunk]:
    """The attempt's output, with a note on stderr where the server had dropped bytes."""
    chunks = (
        client.follow_logs(job_id, attempt, poll_s=FOLLOW_POLL_S)
        if follow
        else [client.logs(job_id, attempt)]
    )
    expected = 0
    for chunk in chunks:
        if chunk.start > expected:
            print(
                f"corral: {chunk.start - expected} bytes of {job_id}'s attempt {chunk.attempt} output were"
                " dropped (over CORRAL_LOG_MAX_BYTES)",
                file=sys.stderr,
            )
        expected = chunk.start + len(chunk.data)
        yield chunk


def _follow_rank(client: Client, job_id: str, prefix: str, attempt: int | None, printer: RankPrinter) -> None:
    try:
        for chunk in _chunks(client, job_id, attempt, True):
            printer.write(prefix, chunk.data)
        printer.end(prefix)
    except Exception as error:
        printer.error = error


class RankPrinter:
    """Whole lines of every task, each prefixed with its ``prefix`` (``[rank 2] ``); a task's
    unfinished line waits for its end (or for the task's last chunk), so tasks never interleave
    within a line."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.error: Exception | None = None

    def write(self, prefix: str, data: bytes) -> None:
        with self._lock:
            text = self._partial.pop(prefix, b"") + data
            *lines, rest = text.split(b"\n")
            if rest:
                self._partial[prefix] = rest
            self._emit(prefix, lines)

    def end(self, prefix: str) -> None:
        with self._lock:
            rest = self._partial.pop(prefix, b"")
            if rest:
                self._emit(prefix, [rest])

    def _emit(self, prefix: str, lines: list[bytes]) -> None:
        marker = prefix.encode()
        if lines:
            self._out.write(b"".join(marker + line + b"\n" for line in lines))
            self._out.flush()
