"""The cluster's history, pure parts: what a sample counts (``core.history``) and how the overview
draws a day of samples (``dashboard.views.history_chart``: time to x, a round top, a line broken
where no server sampled)."""

from __future__ import annotations

from corral.core import history
from corral.domain.history import ClusterSample, sample_slot
from corral.server.dashboard import views

NOW = 1_800_000_000.0


def test_a_sample_counts_active_workers_gpus_and_the_queue_with_blocked_gangs():
    gpus_by_worker_status = {"active": (4, 2), "draining": (4, 1), "offline": (2, 0)}  # not placeable
    taken = history.sample(
        NOW + 59, {"pending": 3, "blocked": 2, "running": 4, "done": 9}, gpus_by_worker_status
    )
    assert taken == ClusterSample(sample_slot(NOW + 59), 5, 4, 4, 2)
    assert taken.at % 60 == 0 and NOW + 59 - taken.at < 60
    assert history.sample(NOW, {}, {"draining": (8, 8)}) == ClusterSample(sample_slot(NOW), 0, 0, 0, 0)


def test_a_day_is_drawn_left_to_right_with_a_gap_where_nothing_was_sampled():
    now = sample_slot(NOW)
    minutes = [*range(600, 590, -1), *range(100, 0, -1)]  # ten minutes ten hours ago, then the last 100
    samples = [ClusterSample(now - 60 * ago, 7, 0, 8, 3) for ago in minutes]
    samples.append(ClusterSample(now - 2 * 86400, 99, 0, 8, 8))  # outside the window: not drawn
    queue, gpus = views.cluster_history(samples, now)
    assert len(queue.lines) == 2, "the gap between the runs is not bridged"
    assert queue.peak == 7 and queue.latest == 7 and queue.samples == 110
    first_x = float(queue.lines[0].split()[0].split(",")[0])
    last_x = float(queue.lines[1].split()[-1].split(",")[0])
    assert 0 < first_x < last_x <= views.PLOT_WIDTH
    assert [label for _, label in queue.y_ticks] == ["0", "5", "10"], "a round top above the peak"
    assert len(gpus.ceiling) == 2 and gpus.y_ticks[-1][1] == "10"
    assert len(queue.x_ticks) in (7, 8) and all(len(tick.label) == 5 for tick in queue.x_ticks), "HH:MM"


def test_an_empty_history_draws_nothing():
    queue, gpus = views.cluster_history([], NOW)
    assert queue.lines == [] and gpus.ceiling == [] and queue.latest is None


def test_a_gap_is_measured_in_sampling_intervals():
    now = sample_slot(NOW, 300)
    samples = [ClusterSample(now - 300 * ago, 1, 0, 8, 3) for ago in range(20, -1, -1)]
    assert len(views.cluster_history(samples, now, every_s=300)[0].lines) == 1, "no gap: one each interval"
    assert len(views.cluster_history(samples, now)[0].lines) == 21, "five minutes apart are gaps at a minute"
    missing = [sample for sample in samples if not 5 <= (now - sample.at) / 300 <= 8]
    assert len(views.cluster_history(missing, now, every_s=300)[0].lines) == 2, "four intervals missing"


def test_a_sample_is_stored_under_its_intervals_start():
    taken = history.sample(NOW + 299, {"pending": 1}, {"active": (2, 0)}, every_s=300)
    assert taken.at == sample_slot(NOW + 299, 300) and taken.at % 300 == 0 and NOW + 299 - taken.at < 300
    assert [views.interval_words(seconds) for seconds in (60, 300, 30, 90)] == [
        "minute",
        "5 minutes",
        "30 s",
        "90 s",
    ]


def test_the_latest_value_reads_in_the_singular_or_the_plural():
    now = sample_slot(NOW)
    queue, gpus = views.cluster_history([ClusterSample(now, 1, 0, 8, 2)], now)
    assert (queue.latest, queue.unit, gpus.latest, gpus.unit) == (1, "job waiting", 2, "GPUs held")
