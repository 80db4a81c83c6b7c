"""``server.one_write.HeldHead``: an answer's head and body in one write, a streamed answer's head
never held past the loop's turn, interim answers passed at once."""

from __future__ import annotations

import asyncio

from corral.server.one_write import HeldHead

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    """The writes a transport was given, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def test_head_and_body_leave_in_one_write() -> None:
    async def answer() -> list[bytes]:
        transport = RecordingTransport()
        held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(HEAD)
        assert transport.writes == []
        held.write(b"{}")
        await asyncio.sleep(0)  # the end-of-turn flush was cancelled: nothing more
        return transport.writes

    assert asyncio.run(answer()) == [HEAD + b"{}"]


def test_a_streamed_answer_gets_its_head_at_the_end_of_the_turn() -> None:
    async def answer() -> list[bytes]:
        transport = RecordingTransport()
        held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(0)  # the first chunk waits on something: the head goes alone
        held.write(b"5\r\nhello\r\n")
        held.write(b"0\r\n\r\n")
        return transport.writes

    assert asyncio.run(answer()) == [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        b"5\r\nhello\r\n",
        b"0\r\n\r\n",
    ]


def test_an_interim_answer_is_not_held() -> None:
    async def answer() -> list[bytes]:
        transport = RecordingTransport()
        held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        first = list(transport.writes)
        held.write(HEAD)
        held.write(b"{}")
        return [*first, b"--", *transport.writes[1:]]

    assert asyncio.run(answer()) == [b"HTTP/1.1 100 Continue\r\n\r\n", b"--", HEAD + b"{}"]


def test_close_sends_a_held_head_first() -> None:
    async def answer() -> tuple[list[bytes], bool, str]:
        transport = RecordingTransport()
        held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(HEAD)
        held.close()
        await asyncio.sleep(0)
        return transport.writes, transport.closed, held.get_extra_info("peername")

    assert asyncio.run(answer()) == ([HEAD], True, "info peername")
