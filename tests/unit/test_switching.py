"""The switch interval is short only while long work runs beside the event loop."""

from __future__ import annotations

import sys
import threading

from corral.server import switching


def test_short_while_any_long_work_runs_then_the_interpreters_own_again() -> None:
    before = sys.getswitchinterval()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[float] = []

    def first() -> None:
        with switching.long_work():
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    def second() -> None:
        assert first_in.wait(10)
        with switching.long_work():
            second_in.set()
            assert first_out.wait(10)
            seen.append(sys.getswitchinterval())  # the first ended: still short, this one runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [min(switching.SHORT_S, before)]
    assert sys.getswitchinterval() == before
