"""The worker's log shipper: the job's output reaches the server in order, once, in chunks, without
the job ever waiting for the network; and an attempt's whole output is there before its report."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from corral.client import ApiError, ServerUnreachable
from corral.testing.fake_client import FakeClient
from corral.worker import log_shipper
from corral.worker.job_run import StopReason
from corral.worker.log_shipper import RETRY_S, LogShipper
from tests.unit.worker_support import finish, make_run, wait_for


class Server:
    """A log endpoint with the server's append rule (idempotent by offset), scriptable."""

    def __init__(self) -> None:
        self.stream = bytearray()
        self.offsets: list[int] = []
        self.fail_next: list[Exception] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def send(self, offset: int, data: bytes) -> int:
        self.gate.wait()
        with self.lock:
            self.offsets.append(offset)
            if self.fail_next:
                raise self.fail_next.pop(0)
            assert offset <= len(self.stream), "a hole in the stream"
            self.stream += data[len(self.stream) - offset :]
            return len(self.stream)


def test_output_arrives_in_order_and_once_even_through_retries():
    server = Server()
    server.fail_next = [ServerUnreachable("http://x", OSError("down")), ApiError(503, "unavailable", "later")]
    shipper = LogShipper(server.send, chunk_bytes=8, delay_s=0.01).start()
    written = b"".join(f"line {n}\n".encode() for n in range(200))
    for start in range(0, len(written), 37):
        shipper.write(written[start : start + 37])
    shipper.close()
    assert bytes(server.stream) == written
    assert server.offsets[0] == server.offsets[1] == server.offsets[2] == 0  # resent at the same offset
    assert shipper.offset == len(written)


def test_a_slow_server_never_blocks_the_writer_and_the_oldest_bytes_are_dropped_with_a_note():
    server = Server()
    server.gate.clear()  # every send hangs until the gate opens
    shipper = LogShipper(server.send, chunk_bytes=16, buffer_bytes=64).start()
    for n in range(10_000):
        shipper.write(b"%08d\n" % n)
    assert not server.gate.is_set(), "every write returned while the send still hangs"
    assert shipper.dropped_total > 0
    server.gate.set()
    shipper.close()
    text = bytes(server.stream).decode()
    assert "bytes of output dropped" in text
    assert text.endswith("00009999\n")


def test_a_stale_attempt_stops_shipping_and_close_returns_at_once():
    server = Server()
    server.fail_next = [ApiError(409, "stale_attempt", "not yours")]
    # a flush timeout past the test's own: close returns only because shipping stopped
    shipper = LogShipper(server.send, flush_timeout_s=3600).start()
    shipper.write(b"x" * 100)
    wait_for(lambda: bool(server.offsets), "a send")
    shipper.write(b"more")
    shipper.close()
    assert server.stream == b""
    assert len(server.offsets) == 1


def test_close_gives_up_after_its_timeout_when_the_server_is_gone():
    server = Server()
    server.fail_next = [ServerUnreachable("http://x", OSError("down"))] * 1000
    shipper = LogShipper(server.send, flush_timeout_s=0.3).start()
    shipper.write(b"lost\n")
    shipper.close()  # returns: the server never answered and the flush timeout ran out
    assert server.stream == b""


def test_an_attempt_ships_its_whole_output_before_its_report():
    client = FakeClient()
    run = make_run(client, "for i in 1 2 3; do echo out $i; echo err $i >&2; done; sleep 0.2; echo last")
    run.start()
    finish(run)
    text = client.log_text()
    assert text.splitlines() == ["out 1", "err 1", "out 2", "err 2", "out 3", "err 3", "last"]
    assert client.names()[-1] == "done"


def test_output_is_shipped_while_the_job_runs():
    client = FakeClient()
    run = make_run(client, "echo started; sleep 30", heartbeat_s=0.05)
    run.start()
    wait_for(lambda: client.log_text() == "started\n", "the first line on the server")
    run.request_stop(StopReason.SHUTDOWN)
    finish(run)


class FakeTime:
    """The shipper's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_after_a_quiet_spell_goes_at_once_and_the_next_ones_after_the_delay():
    server, clock = Server(), FakeTime()
    # Not started: no thread ships; the test asks what is due when.
    shipper = LogShipper(server.send, chunk_bytes=64, delay_s=0.25, clock=clock)
    assert shipper.delay(clock()) is None  # nothing waiting: no wake-up at all
    shipper.write(b"first\n")
    assert shipper.delay(clock()) == 0
    shipper.ship_due()
    assert server.stream == b"first\n"
    clock.now += 0.125
    shipper.write(b"second\n")
    assert shipper.delay(clock()) == 0.125  # batched with what follows for 0.25 s
    shipper.ship_due()
    assert server.stream == b"first\n"
    clock.now += 0.0625
    shipper.write(b"third\n")
    shipper.ship_due()
    assert server.stream == b"first\n"
    clock.now += 0.0625  # 0.25 s after the last send
    assert shipper.delay(clock()) == 0
    shipper.ship_due()
    assert server.stream == b"first\nsecond\nthird\n"
    assert len(server.offsets) == 2  # one request for the two lines


def test_a_full_chunk_goes_at_once_and_a_failed_send_is_retried_after_the_retry_pause():
    server, clock = Server(), FakeTime()
    shipper = LogShipper(server.send, chunk_bytes=64, delay_s=0.25, clock=clock)
    shipper.write(b"a\n")
    shipper.ship_due()
    shipper.write(b"x" * 200)  # three full chunks and a rest, right after a send
    assert shipper.delay(clock()) == 0
    shipper.ship_due()
    assert len(server.stream) == 2 + 192  # the full chunks; the rest waits for the delay
    clock.now += 0.25
    server.fail_next = [ServerUnreachable("http://x", OSError("down"))]
    assert not shipper.ship_due()
    assert shipper.delay(clock()) == pytest.approx(RETRY_S)
    clock.now += RETRY_S
    assert shipper.ship_due()
    assert bytes(server.stream) == b"a\n" + b"x" * 200


def numbered_lines(total_bytes: int) -> bytes:
    lines = []
    size = 0
    number = 0
    while size < total_bytes:
        line = b"line %010d " % number + b"." * 100 + b"\n"
        lines.append(line)
        size += len(line)
        number += 1
    return b"".join(lines)


def test_a_burst_past_the_buffer_spills_to_disk_and_arrives_whole_and_in_order(tmp_path: Path):
    server = Server()
    server.gate.clear()  # a slow server: nothing is taken until the whole burst was written
    spill_path = tmp_path / "spill" / "j-1-1.log"
    shipper = LogShipper(server.send, spill_path=spill_path).start()
    written = numbered_lines(24 * 1000 * 1000)
    for start in range(0, len(written), 65536):
        shipper.write(written[start : start + 65536])
    assert not server.gate.is_set(), "every write returned while the send still hangs"
    assert spill_path.stat().st_size > 8 * 1000 * 1000  # the part past the 8 MiB buffer is on disk
    assert shipper.dropped_total == 0
    server.gate.set()
    shipper.close()
    assert bytes(server.stream) == written  # nothing lost from the middle, in order
    assert not spill_path.exists()  # removed once the attempt's shipping ended


def test_past_the_spill_bound_the_oldest_unsent_bytes_are_dropped_with_a_note_in_their_place(
    tmp_path: Path,
):
    server = Server()
    server.gate.clear()
    spill_path = tmp_path / "j-1-1.log"
    shipper = LogShipper(
        server.send, chunk_bytes=256, buffer_bytes=1024, spill_path=spill_path, spill_max_bytes=4096
    ).start()
    written = b"".join(b"%08d\n" % n for n in range(2000))
    for start in range(0, len(written), 90):
        shipper.write(written[start : start + 90])
    assert shipper.spilled_total > 0 and shipper.dropped_total > 0
    server.gate.set()
    shipper.close()
    text = bytes(server.stream)
    before, note, after = text.partition(b"\n[corral: %d bytes of output dropped" % shipper.dropped_total)
    assert note, "one note, of every byte dropped"
    assert written.startswith(before)  # what was spilled comes first, whole
    assert written.endswith(after.split(b"]\n", 1)[1])  # then the newest bytes
    assert len(before) + len(after.split(b"]\n", 1)[1]) + shipper.dropped_total == len(written)
    assert not spill_path.exists()


def test_a_spill_that_cannot_be_written_falls_back_to_dropping(tmp_path: Path):
    server = Server()
    server.gate.clear()
    (tmp_path / "blocked").write_text("a file where the spill directory would be")
    shipper = LogShipper(
        server.send, chunk_bytes=16, buffer_bytes=64, spill_path=tmp_path / "blocked" / "j-1-1.log"
    ).start()
    for n in range(1000):
        shipper.write(b"%08d\n" % n)
    server.gate.set()
    shipper.close()
    text = bytes(server.stream).decode()
    assert "bytes of output dropped" in text
    assert text.endswith("00000999\n")


def test_a_spill_too_large_to_send_at_the_end_gives_way_to_the_end_of_the_output(tmp_path: Path):
    server = Server()
    server.gate.clear()
    sends = server.send

    def slow_send(offset: int, data: bytes) -> int:
        time.sleep(0.01)
        return sends(offset, data)

    spill_path = tmp_path / "j-1-1.log"
    shipper = LogShipper(
        slow_send, chunk_bytes=16, buffer_bytes=256, spill_path=spill_path, flush_timeout_s=0.5
    ).start()
    written = b"".join(b"%08d\n" % n for n in range(20_000))  # 180 kB: 11,000 sends of 16 bytes
    for start in range(0, len(written), 90):
        shipper.write(written[start : start + 90])
    shipper.write(b"the error at the end\n")
    server.gate.set()
    shipper.close()
    text = bytes(server.stream)
    assert b"bytes of output dropped" in text
    assert text.endswith(b"00019999\nthe error at the end\n")
    assert written.startswith(text.split(b"\n[corral: ", 1)[0])  # the spill's start, in order
    assert not spill_path.exists()


def test_spill_files_a_killed_worker_left_are_cleared(tmp_path: Path):
    directory = log_shipper.spill_directory(tmp_path)
    assert log_shipper.clear_spills(directory) == 0  # none yet: no directory
    directory.mkdir()
    (directory / "j-1-1.log").write_bytes(b"old")
    assert log_shipper.clear_spills(directory) == 1
    assert list(directory.iterdir()) == []
