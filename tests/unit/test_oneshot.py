"""``corral.oneshot``: the CLI's one-request-per-connection HTTP client (its real traffic is every
test of tests/api/test_cli.py; here the answers a server should not send)."""

from __future__ import annotations

import pytest

from corral.http_response import TransportError
from corral.oneshot import OneShotTransport, _parse


def test_an_answer_framed_by_length_chunks_or_the_close():
    by_length = _parse(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-Request-ID: a\r\n\r\n{}")
    assert (by_length.status_code, by_length.reason_phrase, by_length.content) == (201, "Created", b"{}")
    assert by_length.headers["x-request-id"] == "a"
    chunked = _parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert chunked.content == b"abcde"
    assert _parse(b"HTTP/1.0 204 No Content\r\n\r\n").content == b""


@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", b"HTTP/1.1 200 OK\r\nContent", b"SSH-2.0\r\n\r\n"],
)
def test_a_cut_or_foreign_answer_is_a_transport_error(answer):
    with pytest.raises(TransportError):
        _parse(answer)


def test_an_unreachable_server_is_a_transport_error():
    with pytest.raises(TransportError):
        OneShotTransport("http://127.0.0.1:9", 1.0).request("GET", "/health")
    with pytest.raises(ValueError):
        OneShotTransport("https://example.invalid", 1.0)
