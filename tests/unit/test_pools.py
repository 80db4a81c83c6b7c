"""Pools in the domain: paths, inheritance down the tree (``resolve``), the pool of a path without
a row (``effective``), and usage summed over subtrees."""

from __future__ import annotations

import pytest

from corral.domain.pools import (
    UNLIMITED,
    Pool,
    PoolDefaults,
    PoolKind,
    PoolMode,
    PoolSettings,
    PoolUsage,
    ancestors,
    check_path,
    created_reason,
    effective,
    resolve,
    subtree_usage,
    tree_order,
    with_ancestors,
)
from corral.domain.records import Reason
from corral.domain.resources import Resources

DEFAULTS = PoolDefaults(starvation_timeout_s=10, aggressive_starvation_timeout_s=50, starvation_tolerance=0.5)


@pytest.mark.parametrize("path", ["default", "a", "team/x", "a/b.c/d-e_f", "A1/2"])
def test_a_pool_path_is_segments_joined_by_slashes(path):
    assert check_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "/a", "a/", "a//b", "a b", "a/b c", "é", "a\0b", "a/../b", "./a", "x" * 257]
)
def test_anything_else_is_not_a_pool_path(path):
    with pytest.raises(ValueError, match="pool must be"):
        check_path(path)


def test_a_path_implies_its_ancestors_parents_first():
    assert ancestors("a/b/c") == ["a", "a/b"]
    assert ancestors("a") == []
    assert with_ancestors(["x/y", "a/b/c", "a"]) == ["a", "x", "a/b", "x/y", "a/b/c"]


def test_with_no_rows_but_default_every_setting_is_the_default():
    pools = resolve({"default": PoolSettings()}, PoolDefaults())
    assert pools == {"default": Pool("default", None, explicit=True)}
    pool = pools["default"]
    assert (pool.weight, pool.guarantee, pool.limits) == (1.0, Resources(), None)
    assert (pool.mode, pool.kind) == (PoolMode.FAIR_SHARE, PoolKind.BATCH)
    assert (pool.starvation_timeout_s, pool.aggressive_starvation_timeout_s, pool.starvation_tolerance) == (
        30.0,
        120.0,
        0.8,
    )
    assert (pool.enable_aggressive_starvation, pool.allow_aggressive_preemption) == (False, True)


def test_default_always_exists_and_ancestors_are_implied():
    pools = resolve({"a/b/c": PoolSettings(weight=3)}, DEFAULTS)
    assert list(pools) == ["a", "a/b", "a/b/c", "default"]
    assert [pools[path].explicit for path in pools] == [False, False, True, False]
    assert [pools[path].parent for path in pools] == [None, "a", "a/b", None]


def test_inherited_settings_pass_down_three_levels_and_the_nearest_setting_wins():
    stored = {
        "org": PoolSettings(
            kind=PoolKind.SENSITIVE,
            mode=PoolMode.FIFO,
            starvation_timeout_s=20,
            enable_aggressive_starvation=True,
            allow_aggressive_preemption=False,
        ),
        "org/team": PoolSettings(starvation_tolerance=0.9, allow_aggressive_preemption=True),
        "org/team/run": PoolSettings(kind=PoolKind.TRAINING, enable_aggressive_starvation=False),
    }
    pools = resolve(stored, DEFAULTS)
    org, team, run = pools["org"], pools["org/team"], pools["org/team/run"]
    assert (org.kind, team.kind, run.kind) == (PoolKind.SENSITIVE, PoolKind.SENSITIVE, PoolKind.TRAINING)
    assert (org.mode, team.mode, run.mode) == (PoolMode.FIFO,) * 3
    assert (org.starvation_timeout_s, team.starvation_timeout_s, run.starvation_timeout_s) == (20, 20, 20)
    assert org.aggressive_starvation_timeout_s == run.aggressive_starvation_timeout_s == 50  # the defaults'
    assert (org.starvation_tolerance, team.starvation_tolerance, run.starvation_tolerance) == (0.5, 0.9, 0.9)
    assert (org.enable_aggressive_starvation, team.enable_aggressive_starvation) == (True, True)
    assert run.enable_aggressive_starvation is False  # an explicit False overrides, not "unset"
    assert (org.allow_aggressive_preemption, team.allow_aggressive_preemption) == (False, True)
    assert run.allow_aggressive_preemption is True


def test_weight_guarantee_and_limits_belong_to_the_pool_that_sets_them():
    stored = {
        "a": PoolSettings(weight=4, guarantee=Resources(gpus=8), limits=Resources(16, *(UNLIMITED,) * 3)),
        "a/b": PoolSettings(),
    }
    pools = resolve(stored, DEFAULTS)
    assert (pools["a"].weight, pools["a"].guarantee.gpus, pools["a"].limits) == (
        4,
        8,
        Resources(16, UNLIMITED, UNLIMITED, UNLIMITED),
    )
    assert (pools["a/b"].weight, pools["a/b"].guarantee, pools["a/b"].limits) == (1.0, Resources(), None)


def test_an_aggressive_timeout_is_never_before_the_starvation_timeout():
    pools = resolve({"slow": PoolSettings(starvation_timeout_s=300)}, DEFAULTS)
    assert pools["slow"].aggressive_starvation_timeout_s == 300


def test_the_pool_of_a_path_without_a_row_is_its_nearest_ancestors_settings():
    pools = resolve(
        {"a/b": PoolSettings(kind=PoolKind.SERVICE, weight=5, starvation_tolerance=0.3)}, DEFAULTS
    )
    gone = effective("a/b/c/d", pools, DEFAULTS)
    assert (gone.path, gone.parent, gone.explicit) == ("a/b/c/d", "a/b", False)
    assert (gone.kind, gone.starvation_tolerance) == (PoolKind.SERVICE, 0.3)
    assert gone.weight == 1.0  # not inherited
    assert effective("a/b", pools, DEFAULTS) is pools["a/b"]
    orphan = effective("x/y", pools, DEFAULTS)
    assert (orphan.parent, orphan.kind, orphan.starvation_timeout_s) == (None, PoolKind.BATCH, 10)


def test_a_walk_in_tree_order_visits_each_pool_right_before_its_subtree():
    paths = ["team-b", "team/x", "team", "team.c", "team/x/y", "default"]
    assert sorted(paths, key=tree_order) == ["default", "team", "team/x", "team/x/y", "team-b", "team.c"]
    assert list(resolve({path: PoolSettings() for path in paths}, DEFAULTS)) == sorted(paths, key=tree_order)


def test_usage_of_a_subtree_sums_its_pools_and_keeps_the_largest_vram():
    own = {
        "a": PoolUsage(held=Resources(1, 10, 100, 1), jobs=1),
        "a/b": PoolUsage(held=Resources(2, 40, 200, 2), demand=Resources(gpus=3), jobs=4),
        "c": PoolUsage(demand=Resources(cpus=7), jobs=1),
    }
    totals = subtree_usage(own, ["a", "a/b", "c", "default"])
    assert totals["a"] == PoolUsage(Resources(3, 40, 300, 3), Resources(gpus=3), 5)
    assert totals["a/b"] == own["a/b"]
    assert totals["c"] == own["c"]
    assert totals["default"] == PoolUsage()


def test_a_created_pool_is_said_in_the_reason():
    assert created_reason(Reason("queued", "waiting"), "team/x") == Reason(
        "queued", "waiting; pool 'team/x' created with defaults"
    )
    assert created_reason(None, "p").message == "pool 'p' created with defaults"
