"""Slow-body connections are closed, and one client address cannot hold every socket (issue 12:
800 sockets trickling a body stayed open 92 s)."""

from __future__ import annotations

import socket
import threading
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
    with httpx.Client(base_url=limited.url) as api:
        api.get("/jobs").raise_for_status()  # the client's own start-up is not the slow bodies' window
        socks = [trickle(limited) for _ in range(3)]
        # once the server has read their headers, the three slow requests hold the address's share
        # (a request sent before that would take a share of its own)
        deadline = time.monotonic() + 5
        while limited.state.requests_in_flight.get("127.0.0.1") != 3:
            assert time.monotonic() < deadline, limited.state.requests_in_flight
            time.sleep(0.001)
        refused = api.get("/jobs")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_requests"
        for sock in socks:
            assert read_all(sock).startswith(b"HTTP/1.1 408")
            sock.close()
        assert api.get("/jobs").status_code == 200, "the slots come back when the slow bodies time out"


# --- connections: header and idle timeouts, limits in all and per client (issue 24) ----------------


@pytest.fixture
def guarded(tmp_path, clock) -> Iterator[ServerThread]:
    store = open_store(f"sqlite:///{tmp_path / 'g.db'}")
    settings = ServerSettings(
        header_timeout_s=0.5, idle_timeout_s=0.5, max_connections=4, max_connections_per_client=3
    )
    with ServerThread(store, settings, clock) as running:
        yield running
    store.close()


def connect(server: ServerThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def request(sock: socket.socket, path: str = "/healthz", headers: str = "") -> bytes:
    """One request on ``sock``; the head and body of its answer."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))[15:]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(guarded):
    sock = connect(guarded)
    assert read_all(sock) == b"", "closed without an answer: nothing was asked"
    sock.close()


def test_headers_trickled_a_byte_at_a_time_are_cut_with_a_408(guarded):
    """A slowloris client: each byte arrives well within the timeout, the headers never do. The
    server cuts it while it is still sending (the timeout runs from the request's first byte)."""
    sock = connect(guarded)
    answer: list[bytes] = []
    reader = threading.Thread(target=lambda: answer.append(read_all(sock)))
    reader.start()
    cut = False
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 400:
        try:
            sock.send(bytes([byte]))
        except OSError:  # the server closed the connection
            cut = True
            break
        if not reader.is_alive():
            cut = True
            break
        time.sleep(0.05)  # the trickle's pace, not a wait for the server
    reader.join(timeout=5)
    sock.close()
    assert cut, "the connection outlived 20 s of trickled headers"
    assert answer[0].startswith(b"HTTP/1.1 408"), answer[0][:200]
    assert b"request_timeout" in answer[0]


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(guarded):
    sock = connect(guarded)
    assert request(sock).startswith(b"HTTP/1.1 200")
    sock.settimeout(3)  # uvicorn's own keep-alive timeout (5 s) would miss it
    assert read_all(sock) == b""
    sock.close()


def test_past_its_share_a_client_is_answered_429_and_past_the_limit_everyone_503(guarded):
    held = [connect(guarded) for _ in range(3)]
    for sock in held:
        assert request(sock).startswith(b"HTTP/1.1 200")
    over_share = connect(guarded)
    answer = request(over_share)
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    assert b'"too_many_requests"' in answer and b"connection: close" in answer.lower()
    assert read_all(over_share) == b"", "and closed"
    over_share.close()
    # another client (a fourth connection of a client with a fresh share): the server is full
    guarded.state.connections.per_client = 10
    held.append(connect(guarded))
    assert request(held[-1]).startswith(b"HTTP/1.1 200")
    full = connect(guarded)
    answer = request(full)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b'"unavailable"' in answer and b"retry-after: 1" in answer.lower()
    full.close()
    metrics = request(held[0], "/metrics")
    assert b'corral_http_connections_refused_total{reason="client_share"} 1.0' in metrics
    assert b'corral_http_connections_refused_total{reason="full"} 1.0' in metrics
    assert b'corral_http_connections{state="limit"} 4.0' in metrics
    for sock in held:
        sock.close()


def test_with_authentication_a_client_is_its_token_at_its_address(tmp_path, clock):
    """Two users behind one address each get their own share; a user past its share gets 429."""
    token_file = tmp_path / "tokens"
    token_file.write_text("alice-token user alice\nbob-token user bob\n")
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    settings = ServerSettings(auth_tokens=str(token_file), max_connections_per_client=2)
    alice, bob = "Authorization: Bearer alice-token\r\n", "Authorization: Bearer bob-token\r\n"
    with ServerThread(store, settings, clock) as server:
        held = [connect(server) for _ in range(2)]
        for sock in held:
            assert request(sock, "/jobs", alice).startswith(b"HTTP/1.1 200")
        for _ in range(2):
            held.append(connect(server))
            assert request(held[-1], "/jobs", bob).startswith(b"HTTP/1.1 200"), "bob has his own share"
        third = connect(server)
        answer = request(third, "/jobs", alice)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        third.close()
        for sock in held:
            sock.close()
    store.close()
