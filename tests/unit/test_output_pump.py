"""The worker's one output pump on real pipes: every registered pipe drained to its end, each
chunk to its own listener, whether registrations reach the waiting pump directly (``epoll``) or
through its queue and wake-up pipe (any other selector)."""

from __future__ import annotations

import os
import selectors
import threading

import pytest

from corral.worker.output import OutputPump


@pytest.mark.parametrize("selector", ["default", "poll"])
def test_the_pump_drains_each_pipe_to_its_own_listener_and_end(monkeypatch, selector: str):
    if selector == "poll":
        monkeypatch.setattr(selectors, "DefaultSelector", selectors.PollSelector)
    pump = OutputPump()
    assert pump._direct is (selector == "default" and hasattr(selectors, "EpollSelector"))
    received: dict[int, list[bytes]] = {}
    ended: dict[int, threading.Event] = {}
    writers = {}
    for index in range(20):
        read_end, write_end = os.pipe()
        received[index], ended[index], writers[index] = [], threading.Event(), write_end

        def on_end(index: int = index, read_end: int = read_end) -> None:
            os.close(read_end)
            ended[index].set()

        # Added while the pump waits in its selector: it must see each one without another event.
        pump.add(read_end, received[index].append, on_end)
    for index, write_end in writers.items():
        for step in range(50):
            os.write(write_end, f"pipe{index}-{step}\n".encode())
        os.close(write_end)
    for index in writers:
        assert ended[index].wait(10), f"pipe {index} never reached its end"
        assert b"".join(received[index]).decode().splitlines() == [
            f"pipe{index}-{step}" for step in range(50)
        ]
