"""Time limits (API.md "Time limits"): the worker's limit as a state machine on plain numbers, and
the submit's rule (a pool's default and maximum, inherited down the tree)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from corral.config import ServerSettings, WorkerSettings
from corral.core.walltime import limited, limited_all
from corral.domain import errors
from corral.domain.pools import PoolDefaults, PoolSettings, resolve
from corral.domain.records import JobSpec
from corral.worker.walltime import Step, WalltimeLimit, walltime_limit

SETTINGS = WorkerSettings(walltime_warning_s=60.0)


def test_a_checkpointing_job_is_warned_then_stopped_at_its_limit() -> None:
    limit = walltime_limit(SETTINGS, 600.0, "auto")
    assert limit is not None
    limit.start(1000.0)
    assert limit.next_due() == 1540.0
    assert limit.tick(1539.9) is None
    assert limit.tick(1540.0) == Step.WARN
    assert limit.next_due() == 1600.0
    assert limit.tick(1599.0) is None
    assert limit.tick(1600.0) == Step.STOP
    assert limit.next_due() == math.inf
    assert limit.tick(1700.0) is None, "each step once"


def test_a_job_without_checkpoints_gets_no_warning() -> None:
    limit = walltime_limit(SETTINGS, 600.0, "none")
    assert limit is not None
    limit.start(0.0)
    assert limit.next_due() == 600.0
    assert limit.tick(600.0) == Step.STOP


def test_a_walltime_shorter_than_the_warning_hints_at_once() -> None:
    limit = walltime_limit(SETTINGS, 2.0, "manual")
    assert limit is not None
    limit.start(10.0)
    assert limit.tick(10.0) == Step.WARN
    assert limit.tick(12.0) == Step.STOP


def test_a_late_tick_stops_without_a_warning() -> None:
    """Both due at once (the thread was late): a hint then would only race the SIGTERM."""
    limit = WalltimeLimit(100.0, 60.0)
    limit.start(0.0)
    assert limit.tick(150.0) == Step.STOP
    assert limit.tick(151.0) is None


@pytest.mark.parametrize("value", [None, 0, -1.0, math.inf, math.nan, True, "60"])
def test_no_positive_walltime_is_no_limit(value: object) -> None:
    assert walltime_limit(SETTINGS, value, "auto") is None


def test_a_warning_of_zero_turns_the_hint_off() -> None:
    limit = walltime_limit(WorkerSettings(walltime_warning_s=0.0), 600.0, "auto")
    assert limit is not None and limit.warning_s is None


# --- the submit's rule ---------------------------------------------------------------------------

DEFAULTS = PoolDefaults(default_walltime_s=3600.0, max_walltime_s=86400.0)


def pools() -> dict:
    return resolve(
        {
            "team": PoolSettings(max_walltime_s=7200.0),
            "team/short": PoolSettings(default_walltime_s=600.0),
            "open": PoolSettings(default_walltime_s=None, max_walltime_s=None),
        },
        DEFAULTS,
    )


def test_the_default_and_the_maximum_are_inherited_down_the_tree() -> None:
    resolved = pools()
    assert (resolved["team/short"].default_walltime_s, resolved["team/short"].max_walltime_s) == (
        600.0,
        7200.0,
    )
    assert (resolved["open"].default_walltime_s, resolved["open"].max_walltime_s) == (3600.0, 86400.0)
    assert resolved["default"].max_walltime_s == 86400.0


def test_a_job_without_a_walltime_gets_its_pools_default() -> None:
    resolved = pools()
    assert limited(JobSpec("x", pool="team/short"), resolved["team/short"]).walltime_s == 600.0
    assert limited(JobSpec("x"), resolved["default"]).walltime_s == 3600.0
    kept = JobSpec("x", pool="team", walltime_s=30.0)
    assert limited(kept, resolved["team"]) is kept


def test_an_inherited_default_above_the_maximum_is_cut_to_it() -> None:
    resolved = resolve({"tight": PoolSettings(max_walltime_s=60.0)}, DEFAULTS)
    assert limited(JobSpec("x", pool="tight"), resolved["tight"]).walltime_s == 60.0


def test_a_walltime_above_the_maximum_is_refused_naming_the_field() -> None:
    resolved = pools()
    with pytest.raises(errors.InvalidRequest) as refused:
        limited(JobSpec("x", pool="team/short", walltime_s=7201.0), resolved["team/short"])
    assert refused.value.field == "walltime_s"
    assert "7200" in str(refused.value)
    specs = [JobSpec("x", pool="team", walltime_s=10.0), JobSpec("y", pool="team", walltime_s=9000.0)]
    with pytest.raises(errors.InvalidRequest) as refused:
        limited_all(specs, resolved, DEFAULTS, batch=True)
    assert refused.value.field == "jobs.1.walltime_s"


def test_no_default_and_no_maximum_leave_the_job_unlimited() -> None:
    resolved = resolve({}, PoolDefaults())
    spec = JobSpec("x", pool="any/where")
    assert limited_all([spec], resolved, PoolDefaults(), batch=False) == [spec]
    assert (
        limited_all([JobSpec("x", walltime_s=1e9)], resolved, PoolDefaults(), batch=False)[0].walltime_s
        == 1e9
    )


def test_the_servers_maximum_may_not_be_below_its_default() -> None:
    with pytest.raises(ValidationError, match="at least default_walltime_s"):
        ServerSettings(default_walltime_s=600, max_walltime_s=60)
    assert ServerSettings(default_walltime_s=60, max_walltime_s=60).max_walltime_s == 60.0
