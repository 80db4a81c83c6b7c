"""The switch interval is short only while long work runs beside the event loop, at the value the
server was given (no environment read at import)."""

from __future__ import annotations

import sys
import threading

from corral.server import switching

SHORT_S = 0.0007


def test_short_while_any_long_work_runs_then_the_interpreters_own_again() -> None:
    before = sys.getswitchinterval()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[float] = []

    def first() -> None:
        with switching.long_work(SHORT_S):
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    def second() -> None:
        assert first_in.wait(10)
        with switching.long_work(SHORT_S):
            second_in.set()
            assert first_out.wait(10)
            seen.append(sys.getswitchinterval())  # the first ended: still short, this one runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [min(SHORT_S, before)]
    assert sys.getswitchinterval() == before


def test_without_a_short_interval_the_interpreters_own_stays() -> None:
    before = sys.getswitchinterval()
    with switching.long_work(None):
        assert sys.getswitchinterval() == before


def test_the_setting_is_visible_in_help_with_its_twin_and_the_default_of_before() -> None:
    from corral.config import ServerSettings
    from corral.server.main import build_parser

    assert ServerSettings().switch_interval_s == 0.0005
    text = build_parser().format_help()
    assert "--switch-interval-s" in text and "CORRAL_SWITCH_INTERVAL_S" in text
