"""One write per answer (``server.one_write``) through the real server's HTTP protocol: the cases
where a held head could be lost or misplaced (answers pipelined on one connection, HEAD answers
among them, an upgrade request that makes no response cycle)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from corral.store import open_store
from corral.testing.server import ServerThread


@pytest.fixture
def running(tmp_path, clock) -> Iterator[ServerThread]:
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    with ServerThread(store, clock=clock) as server:
        yield server
    store.close()


def exchange(server: ServerThread, sent: bytes) -> bytes:
    """Send ``sent`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(sent)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_answers_pipelined_on_one_connection_come_back_in_order(running):
    received = exchange(
        running,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)  # a body runs into the next status line
    assert statuses == [b"200", b"404", b"200", b"200"], received


def test_an_upgrade_request_first_on_a_connection_is_answered_not_refused_as_invalid(running):
    received = exchange(
        running,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    assert received.startswith(b"HTTP/1.1 "), received
    assert not received.startswith(b"HTTP/1.1 400 "), received
