"""A TCP relay in front of the server for one worker, which the soak can cut and heal: a worker
partitioned from its server (issue 24 item 3).

While cut, every open connection is closed (a request in flight may have reached the server, its
answer is lost) and every new one is closed as soon as it is accepted, so nothing the worker sends
reaches the server and nothing comes back. The chaos tests' ``PartitionProxy`` does the same at the
HTTP level; bench scripts do not import tests/, and a byte relay is all a partition needs.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class PartitionRelay:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.refused = 0  # connections closed on arrival while cut
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:  # the server is down (a kill -9 round): the worker sees it as such
                _close(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), name="relay", daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.difference_update((source, sink))
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    """Shut down first: it wakes a thread blocked in ``recv`` on the socket, ``close`` alone may not."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
