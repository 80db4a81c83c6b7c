"""One socket write per HTTP answer: an answer's head and its body leave together.

uvicorn writes a response's status line and headers when the app sends ``http.response.start``,
and its body when the app sends ``http.response.body``: two ``send`` calls for every answer, each a
system call that may hand the CPU to the client it wakes (on a 2-core machine shared with the
client and the database, a switch in the middle of an answer). ``bench/protocol.py``'s profile put
the HTTP stack at 44% of the server's samples before this. ``HeldHead`` sits between one
request's ``RequestResponseCycle`` and the connection's transport and holds the head until the
body comes, so that both go in one write.

A head is never held past the event loop's current turn: a streamed answer (a log follow) whose
first chunk waits on something is sent its head at the end of the turn, as before. Interim answers
(``100 Continue``) pass at once: the client waits for them before it sends its body.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeldHead:
    """The transport, as one request's response cycle sees it (``write`` holds the head)."""

    __slots__ = ("_flush", "_head", "_loop", "_passing", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        #: the head waiting for the body, or None
        self._head: bytes | None = None
        #: the end-of-turn flush of a held head
        self._flush: asyncio.Handle | None = None
        #: the head is out: every later write goes straight through
        self._passing = False

    def write(self, data: bytes) -> None:
        if self._passing:
            self._transport.write(data)
            return
        head = self._head
        if head is not None:  # the body (or its first chunk): one write with the head
            self._release()
            self._transport.write(head + data)
            return
        if data[9:10] == b"1":  # an interim answer ("HTTP/1.1 100 Continue"): not the head
            self._transport.write(data)
            return
        self._head = data
        self._flush = self._loop.call_soon(self._send_head)

    def close(self) -> None:
        self._send_head()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _send_head(self) -> None:
        """The held head alone (the end of the turn came first, or the cycle closes)."""
        head = self._head
        if head is not None:
            self._release()
            if not self._transport.is_closing():
                self._transport.write(head)

    def _release(self) -> None:
        self._head = None
        self._passing = True
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
