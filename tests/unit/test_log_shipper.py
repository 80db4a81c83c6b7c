"""The worker's log shipper: the job's output reaches the server in order, once, in chunks, without
the job ever waiting for the network; and an attempt's whole output is there before its report."""

from __future__ import annotations

import threading

from corral.client import ApiError, ServerUnreachable
from corral.testing.fake_client import FakeClient
from corral.worker.job_run import StopReason
from corral.worker.log_shipper import LogShipper
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
    shipper = LogShipper(server.send, interval_s=0.05, chunk_bytes=8).start()
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
    shipper = LogShipper(server.send, interval_s=0.01, chunk_bytes=16, buffer_bytes=64).start()
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
    shipper = LogShipper(server.send, interval_s=0.01, flush_timeout_s=3600).start()
    shipper.write(b"x" * 100)
    wait_for(lambda: bool(server.offsets), "a send")
    shipper.write(b"more")
    shipper.close()
    assert server.stream == b""
    assert len(server.offsets) == 1


def test_close_gives_up_after_its_timeout_when_the_server_is_gone():
    server = Server()
    server.fail_next = [ServerUnreachable("http://x", OSError("down"))] * 1000
    shipper = LogShipper(server.send, interval_s=5, flush_timeout_s=0.3).start()
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
