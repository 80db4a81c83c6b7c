"""Slow-body connections are closed, and one client address cannot hold every socket (issue 12:
800 sockets trickling a body stayed open 92 s)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from corral.config import ServerSettings
from corral.store import open_store
from corral.testing.server import ServerThread


@pytest.fixture
def limited(tmp_path, clock) -> Iterator[ServerThread]:
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    settings = ServerSettings(body_timeout_s=0.5, max_requests_per_client=3)
    with ServerThread(store, settings, clock) as running:
        yield running
    store.close()


def trickle(server: ServerThread) -> socket.socket:
    """A submit that promises 100 bytes of body and sends 10."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"command"'
    )
    return sock


def read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_body_that_does_not_arrive_in_time_is_refused_and_its_connection_closed(limited):
    sock = trickle(limited)
    answer = read_all(sock)  # returns when the server closes the connection
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer


def test_one_address_cannot_hold_more_than_its_share(limited):
    socks = [trickle(limited) for _ in range(3)]
    time.sleep(0.1)
    with httpx.Client(base_url=limited.url) as api:
        refused = api.get("/jobs")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_requests"
        for sock in socks:
            assert read_all(sock).startswith(b"HTTP/1.1 408")
            sock.close()
        assert api.get("/jobs").status_code == 200, "the slots come back when the slow bodies time out"
