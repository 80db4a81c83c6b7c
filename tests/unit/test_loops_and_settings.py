import argparse
import asyncio

import pytest

from corral.config import ServerSettings, WorkerSettings, add_flags, load
from corral.observability.metrics import Metrics
from corral.server.loops.runner import Loop, LoopGroup, LoopRunner


def test_a_failing_pass_is_logged_and_counted_not_raised(caplog):
    metrics = Metrics()
    calls = []

    def tick():
        calls.append(1)
        raise RuntimeError("database went away")

    runner = LoopRunner(Loop("reaper", 0.01, tick), metrics)
    assert runner.run_once() is False
    assert runner.run_once() is False
    assert len(calls) == 2
    assert metrics.registry.get_sample_value("corral_loop_errors_total", {"loop": "reaper"}) == 2
    assert metrics.registry.get_sample_value("corral_scheduling_cycle_seconds_count", {"loop": "reaper"}) == 2
    assert "loop pass failed" in caplog.text


def test_loops_keep_running_through_failures_and_stop_cleanly():
    metrics = Metrics()
    passes = []
    six_passes = asyncio.Event()

    def tick():
        passes.append(1)
        if len(passes) == 6:
            six_passes.set()
        if len(passes) % 2:
            raise ValueError("every other pass fails")

    group = LoopGroup([Loop("flaky", 0.001, tick, jitter=0)], metrics)
    deaths = []

    async def scenario():
        group.start(on_death=lambda name, error: deaths.append(name))
        await six_passes.wait()
        await group.stop()

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert deaths == []
    assert metrics.registry.get_sample_value("corral_loop_leader", {"loop": "flaky"}) == 1


def test_a_loop_that_dies_is_reported():
    metrics = Metrics()
    group = LoopGroup([Loop("doomed", 0.001, lambda: None)], metrics)
    deaths = []

    async def broken_run_forever():
        raise SystemError("runner bug")

    group.runners[0].run_forever = broken_run_forever

    async def scenario():
        group.start(on_death=lambda name, error: deaths.append((name, type(error).__name__)))
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert deaths == [("doomed", "SystemError")]


def parse(settings_class, argv):
    parser = argparse.ArgumentParser()
    add_flags(parser, settings_class)
    return load(settings_class, parser.parse_args(argv))


def test_flags_override_environment_which_overrides_defaults(monkeypatch):
    assert parse(ServerSettings, []).admission_tick_s == 5
    monkeypatch.setenv("CORRAL_ADMISSION_TICK_S", "2")
    monkeypatch.setenv("CORRAL_PORT", "9000")
    settings = parse(ServerSettings, ["--admission-tick-s", "0.5"])
    assert (settings.admission_tick_s, settings.port) == (0.5, 9000)
    worker = parse(WorkerSettings, ["--label", "rack=r1", "--label", "zone=a", "--gpus", "2"])
    assert (worker.label, worker.gpus) == (["rack=r1", "zone=a"], 2)


def test_help_names_every_environment_variable():
    parser = argparse.ArgumentParser()
    add_flags(parser, ServerSettings)
    text = parser.format_help()
    for name in ServerSettings.model_fields:
        assert f"CORRAL_{name.upper()}" in text


def test_a_bad_setting_stops_with_a_message_naming_it(monkeypatch):
    monkeypatch.setenv("CORRAL_HEARTBEAT_TIMEOUT_S", "-1")
    with pytest.raises(SystemExit) as stopped:
        parse(ServerSettings, [])
    assert "heartbeat_timeout_s" in str(stopped.value)
    assert "CORRAL_HEARTBEAT_TIMEOUT_S" in str(stopped.value)


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("CORRAL_HISTORY_INTERVAL_S", "5", "between 10 and 3600 seconds"),
        ("CORRAL_HISTORY_INTERVAL_S", "7200", "between 10 and 3600 seconds"),
        ("CORRAL_HISTORY_RETENTION_DAYS", "0.5", "at least 1 day"),
        ("CORRAL_HISTORY_RETENTION_DAYS", "nan", "at least 1 day"),
        ("CORRAL_HISTORY_RETENTION_DAYS", "inf", "finite"),
        ("CORRAL_HISTORY_INTERVAL_S", "nan", "between 10 and 3600 seconds"),
    ],
)
def test_the_history_settings_say_what_they_allow(monkeypatch, variable, value, why):
    assert (
        parse(ServerSettings, []).history_interval_s,
        parse(ServerSettings, []).history_retention_days,
    ) == (
        60,
        8,
    )
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        parse(ServerSettings, [])
    assert variable in str(stopped.value) and why in str(stopped.value)
    monkeypatch.delenv(variable)
    flag = "--" + variable.removeprefix("CORRAL_").lower().replace("_", "-")
    assert getattr(
        parse(ServerSettings, [flag, "30" if "INTERVAL" in variable else "3"]), flag[2:].replace("-", "_")
    ) in (
        30,
        3,
    )


def test_a_store_process_timeout_under_a_childs_start_is_refused(monkeypatch):
    """A call that starts a child counts its start: a timeout of a few seconds would stop every new
    child before it answered, for ever."""
    assert parse(ServerSettings, []).store_process_timeout_s == 300
    monkeypatch.setenv("CORRAL_STORE_PROCESS_TIMEOUT_S", "5")
    with pytest.raises(SystemExit) as stopped:
        parse(ServerSettings, [])
    assert "CORRAL_STORE_PROCESS_TIMEOUT_S" in str(stopped.value) and "30" in str(stopped.value)
