"""An HTTP proxy that loses answers: the request reaches the server and is applied there, and the
client sees the connection close with no answer, as when the server is killed between its commit
and its reply (or a load balancer drops the connection). For the chaos tests and the bench scripts
(``bench/soak.py``'s partition), never for production traffic.

HTTP/1.1 is parsed only as far as framing needs: a head, then a ``Content-Length`` or chunked
body. Each client connection gets its own upstream connection.

``PartitionProxy`` cuts the link instead: while cut, no request reaches the server and no answer
comes back (a worker partitioned from its server, issue 24 item 3).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import TracebackType

#: decides, from the request's head and the answer's status code, whether to lose the answer
Dropper = Callable[[bytes, int], bool]
#: decides, from the request's head, whether to keep the request from the server altogether
Refuser = Callable[[bytes], bool]


class AnswerDroppingProxy:
    def __init__(self, upstream_url: str, drop: Dropper, refuse: Refuser | None = None) -> None:
        host, port = upstream_url.removeprefix("http://").rstrip("/").split(":")
        self.upstream = (host, int(port))
        self.drop = drop
        self.refuse = refuse
        self.dropped: list[bytes] = []
        self.refused: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def __enter__(self) -> AnswerDroppingProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
            upstream.settimeout(None)
        except OSError:  # the server is down (killed, restarting): its client sees it as such
            client.close()
            return
        client_reader, upstream_reader = _Reader(client), _Reader(upstream)
        try:
            while True:
                request = client_reader.message(is_request=True)
                if request is None:
                    return
                if self.refuse is not None:
                    with self._lock:
                        kept_away = self.refuse(request.split(b"\r\n\r\n", 1)[0])
                        if kept_away:
                            self.refused.append(request.split(b"\r\n", 1)[0])
                    if kept_away:
                        return  # closes both connections: the server never sees the request
                upstream.sendall(request)
                answer = upstream_reader.message(is_request=False)
                if answer is None:
                    return
                status = int(answer.split(b" ", 2)[1])
                head = request.split(b"\r\n\r\n", 1)[0]
                with self._lock:
                    lose = self.drop(head, status)
                    if lose:
                        self.dropped.append(head)
                if lose:
                    return  # closes both connections: the client never sees the answer
                client.sendall(answer)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()


class _Reader:
    """Whole HTTP/1.1 messages off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not self._fill():
                raise OSError("connection closed mid-message")
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        return taken

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise OSError("connection closed mid-message")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line + b"\r\n"

    def message(self, is_request: bool) -> bytes | None:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                return None
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        }
        status_line = head.split(b"\r\n", 1)[0]
        no_body = not is_request and status_line.split(b" ", 2)[1] in (b"204", b"304")
        if no_body:
            body = b""
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = self._chunked()
        else:
            body = self._take(int(headers.get(b"content-length", b"0")))
        return head + b"\r\n\r\n" + body

    def _chunked(self) -> bytes:
        body = b""
        while True:
            size_line = self._line()
            size = int(size_line.split(b";")[0], 16)
            body += size_line
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = self._line()
                    body += line
                    if line == b"\r\n":
                        return body
            body += self._take(size + 2)


class PartitionProxy(AnswerDroppingProxy):
    """A link that ``cut`` breaks and ``heal`` mends: while cut, every request is kept from the
    server and every answer in flight is lost (the connection closes). ``refused`` lists the
    request lines kept away, so a test can wait for the worker to have tried."""

    def __init__(self, upstream_url: str) -> None:
        self._cut = threading.Event()
        super().__init__(
            upstream_url,
            drop=lambda head, status: self._cut.is_set(),
            refuse=lambda head: self._cut.is_set(),
        )

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        self._cut.clear()
