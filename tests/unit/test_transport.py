"""The SDK's keep-alive transport: reuse, a stale connection retried once, clear errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corral.transport import TlsError, Transport, TransportError


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    close_after_answer = False

    def do_GET(self) -> None:
        body = f"{self.path} {self.client_address[1]}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        # Close without saying so: what a server does to an idle keep-alive connection.
        self.close_connection = self.close_after_answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_requests_reuse_one_connection_and_encode_params(server):
    transport = Transport(f"http://127.0.0.1:{server.server_port}", 5)
    first = transport.request("GET", "/jobs", params={"status": "done", "after": None, "limit": 2})
    second = transport.request("GET", "/jobs")
    assert first.status_code == 200
    assert first.text.split()[0] == "/jobs?status=done&limit=2"
    assert first.text.split()[1] == second.text.split()[1], "same client port: the connection was kept"
    transport.close()


def test_a_connection_the_server_closed_is_replaced_once(server, monkeypatch):
    monkeypatch.setattr(_Handler, "close_after_answer", True)
    transport = Transport(f"http://127.0.0.1:{server.server_port}", 5)
    ports = {transport.request("GET", f"/{index}").text.split()[1] for index in range(3)}
    assert len(ports) == 3, "each request after a silent close went out on a fresh connection"
    transport.close()


def test_an_unreachable_server_is_a_transport_error():
    transport = Transport("http://127.0.0.1:9", 1)
    with pytest.raises(TransportError):
        transport.request("GET", "/health")


def test_only_http_urls():
    with pytest.raises(TransportError, match="server URL"):
        Transport("ftp://example", 1).request("GET", "/")


def test_an_unreadable_ca_file_is_a_tls_error_at_the_first_request(tmp_path):
    missing = Transport("https://127.0.0.1:9", 1, ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(TlsError, match=r"cannot read the CA file .*missing\.pem"):
        missing.request("GET", "/health")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    junk = Transport("https://127.0.0.1:9", 1, ca_file=str(tmp_path / "junk.pem"))
    with pytest.raises(TlsError, match="holds no usable certificate"):
        junk.request("GET", "/health")
    # Plain HTTP never reads it.
    with pytest.raises(TransportError) as raised:
        Transport("http://127.0.0.1:9", 1, ca_file=str(tmp_path / "missing.pem")).request("GET", "/")
    assert not isinstance(raised.value, TlsError)


def test_both_transports_send_the_same_request_target():
    """``http_response.request_target``: the server URL's path, the route, the query without the
    parameters that are None."""
    from corral.http_response import request_target

    assert request_target("", "/jobs") == "/jobs"
    assert request_target("/corral", "/jobs/next", {"worker_id": "w 1", "max": None, "wait_s": 2}) == (
        "/corral/jobs/next?worker_id=w+1&wait_s=2"
    )
