"""Many tasks' output as prefixed lines (``corral.log_lines``, behind the SDK handles' ``logs``),
against a scripted server: what each round reads and when each task's stream ends."""

from __future__ import annotations

from typing import Any

from corral import log_lines
from corral.connection import LogChunk
from corral.testing.fake_client import job_answer


class Scripted:
    """The server's side: each round's jobs, and each (job, attempt)'s stored bytes served at most
    ``page`` bytes per read."""

    def __init__(self, rounds: list[list[tuple[str, str, int]]], page: int = 1 << 20) -> None:
        self.rounds = rounds  # per round: (job id, status, attempt)
        self.stored: dict[tuple[str, int], bytes] = {}
        self.page = page
        self.reads: list[tuple[str, int | None, int]] = []
        self.round = 0
        #: what to store once a round's jobs were read: (job id, attempt) -> bytes appended
        self.writes: dict[int, dict[tuple[str, int], bytes]] = {}

    def read_tasks(self) -> list[tuple[Any, str]]:
        jobs = self.rounds[min(self.round, len(self.rounds) - 1)]
        for key, data in self.writes.get(self.round, {}).items():
            self.stored[key] = self.stored.get(key, b"") + data
        self.round += 1
        return [(job_answer(name, status, attempt=attempt), f"[{name}] ") for name, status, attempt in jobs]

    def read_log(self, job_id: str, attempt: int | None, offset: int) -> LogChunk:
        self.reads.append((job_id, attempt, offset))
        assert attempt is not None
        data = self.stored.get((job_id, attempt), b"")
        return LogChunk(attempt, offset, len(data), 0, data[offset : offset + self.page])


def test_stored_output_is_read_page_by_page_and_the_last_line_kept():
    server = Scripted([[("a", "done", 1), ("b", "failed", 2)]], page=4)
    server.stored = {("a", 1): b"one\ntwo\nthree", ("b", 2): b"x\n", ("b", 1): b"old\n"}
    lines = list(log_lines.lines(server.read_tasks, server.read_log, None, follow=False, poll_s=0))
    assert lines == ["[a] one", "[a] two", "[a] three", "[b] x"]  # b's latest attempt only
    assert [read for read in server.reads if read[0] == "a"] == [("a", 1, offset) for offset in (0, 4, 8, 12)]


def test_a_follow_waits_for_a_task_to_start_and_ends_with_its_attempt():
    server = Scripted(
        [
            [("a", "pending", 0), ("b", "running", 1)],
            [("a", "running", 1), ("b", "running", 1)],
            [("a", "running", 1), ("b", "done", 1)],
            [("a", "pending", 2), ("b", "done", 1)],  # a's attempt 1 ended: retried
        ]
    )
    server.writes = {
        0: {("b", 1): b"b-first\nb-"},
        1: {("a", 1): b"a-first\n"},
        2: {("b", 1): b"end\n", ("a", 1): b"a-last"},
    }
    lines = list(log_lines.lines(server.read_tasks, server.read_log, None, follow=True, poll_s=0))
    # a's unfinished line waits for its end; b's for b's next bytes
    assert lines == ["[b] b-first", "[a] a-first", "[b] b-end", "[a] a-last"]
    assert server.round == 4  # a's stream ended only once a's job moved past attempt 1
    assert ("a", 2, 0) not in server.reads


def test_a_run_after_a_refund_is_followed_by_its_run_number():
    """The job's ``attempt`` is the run number (``attempts`` counts only the runs not refunded)."""
    server = Scripted([[("a", "running", 3)], [("a", "done", 3)]])
    server.writes = {0: {("a", 3): b"resumed\n"}, 1: {("a", 3): b"finished\n"}}
    lines = list(log_lines.lines(server.read_tasks, server.read_log, None, follow=True, poll_s=0))
    assert lines == ["[a] resumed", "[a] finished"]


def test_a_task_cancelled_before_it_started_ends_with_nothing():
    server = Scripted([[("a", "cancelled", 0)]])
    assert list(log_lines.lines(server.read_tasks, server.read_log, None, follow=True, poll_s=0)) == []
    assert server.reads == []


def test_an_asked_for_attempt_is_read_whatever_the_latest():
    server = Scripted([[("a", "running", 2)]])
    server.stored = {("a", 1): b"first run\n", ("a", 2): b"second run\n"}
    lines = list(log_lines.lines(server.read_tasks, server.read_log, 1, follow=True, poll_s=0))
    assert lines == ["[a] first run"]  # attempt 1 has ended: the follow ends with it
