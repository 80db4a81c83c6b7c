"""``corral logs JOB [-f] [--attempt N]``: what a job printed (stdout and stderr, as written).

Without ``-f``, the output stored so far of the attempt (the latest by default). With ``-f``, the
output as it is written, until the attempt ends (a job that has not started yet is waited for); a
Ctrl-C stops following cleanly (exit 130). A gang id (``g-…``) shows every rank's output, each line
prefixed with ``[rank N]``; with ``-f`` the ranks are followed together, line by line.

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
from corral.cli.options import connect
from corral.client import Client, LogChunk

#: how often a follow asks the server for new output
FOLLOW_POLL_S = 0.5


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "logs",
        parents=[parent],
        help="what a job printed",
        description="Print a job's output (stdout and stderr, interleaved as written); a gang's per rank.",
    )
    parser.add_argument("job", metavar="JOB", help="job id (j-…) or gang id (g-…)")
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
    with connect(arguments) as client:
        if not arguments.job.startswith("g-"):
            for chunk in _chunks(client, arguments.job, arguments.attempt, arguments.follow):
                out.write(chunk.data)
                out.flush()
            return exit_codes.OK
        tasks = client.gang(arguments.job).tasks
        printer = RankPrinter(out)
        if not arguments.follow:
            for task in tasks:
                for chunk in _chunks(client, task.id, arguments.attempt, False):
                    printer.write(task.gang_index or 0, chunk.data)
                printer.end(task.gang_index or 0)
            return exit_codes.OK
        followers = [
            threading.Thread(
                target=_follow_rank,
                args=(client, task.id, task.gang_index or 0, arguments.attempt, printer),
                daemon=True,
            )
            for task in tasks
        ]
        for follower in followers:
            follower.start()
        for follower in followers:
            while follower.is_alive():  # a timed join, so Ctrl-C reaches the main thread
                follower.join(0.2)
        if printer.error is not None:
            raise printer.error
    return exit_codes.OK


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


def _follow_rank(client: Client, job_id: str, rank: int, attempt: int | None, printer: RankPrinter) -> None:
    try:
        for chunk in _chunks(client, job_id, attempt, True):
            printer.write(rank, chunk.data)
        printer.end(rank)
    except Exception as error:
        printer.error = error


class RankPrinter:
    """Whole lines of every rank, each prefixed with its rank; a rank's unfinished line waits for
    its end (or for the rank's last chunk), so ranks never interleave within a line."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.error: Exception | None = None

    def write(self, rank: int, data: bytes) -> None:
        with self._lock:
            text = self._partial.pop(rank, b"") + data
            *lines, rest = text.split(b"\n")
            if rest:
                self._partial[rank] = rest
            self._emit(rank, lines)

    def end(self, rank: int) -> None:
        with self._lock:
            rest = self._partial.pop(rank, b"")
            if rest:
                self._emit(rank, [rest])

    def _emit(self, rank: int, lines: list[bytes]) -> None:
        prefix = f"[rank {rank}] ".encode()
        if lines:
            self._out.write(b"".join(prefix + line + b"\n" for line in lines))
            self._out.flush()
