"""The overview's last 24 hours (issue 23 item 7): the ``history`` loop samples the queue and the
GPUs allocated once a minute into the store, a second pass in the same minute (a replica, a new
leader) writes nothing, samples past eight days go, and any replica on the same store draws the
same chart. The interval and the retention are settings (``CORRAL_HISTORY_INTERVAL_S``,
``CORRAL_HISTORY_RETENTION_DAYS``)."""

from __future__ import annotations

import re

import httpx

from corral.domain.history import sample_slot
from corral.store import open_store
from corral.testing.server import ServerThread
from tests.api.conftest import claim, register, submit


def polylines(html: str) -> list[list[tuple[float, float]]]:
    """The series lines of the overview's charts, as points."""
    return [
        [tuple(map(float, point.split(","))) for point in points.split()]
        for points in re.findall(r'<polyline class="series[^"]*" points="([^"]+)"', html)
    ]


def test_the_overview_charts_a_sample_a_minute(server, api, clock):
    empty = api.get("/").text
    assert "no sample yet: the server samples every minute" in empty and "<polyline" not in empty
    register(api, "w1", gpus=4)
    submit(api, resources={"gpus": 3})
    claim(api, "w1")
    submit(api, resources={"gpus": 2})  # waits: one GPU left
    server.run_loop("history")
    clock.advance(60)
    submit(api)
    server.run_loop("history")
    clock.advance(20)
    server.run_loop("history")  # the same minute again: nothing written
    samples = server.state.store.history.samples(0, clock.now())
    assert [(sample.queued_jobs, sample.gpus_allocated, sample.gpus_total) for sample in samples] == [
        (1, 3, 4),
        (2, 3, 4),
    ]
    assert samples[1].at - samples[0].at == 60 and samples[0].at == sample_slot(samples[0].at)
    page = api.get("/").text
    queue, gpus = polylines(page)
    assert len(queue) == len(gpus) == 2, "one point per sample"
    assert queue[1][1] < queue[0][1], "a longer queue is drawn higher"
    assert "now 2 jobs waiting, peak 2" in page and "now 3 GPUs held" in page
    assert '<polyline class="ceiling"' in page, "the GPUs there were, as a dashed line"


def test_samples_past_eight_days_are_removed(server, api, clock):
    server.run_loop("history")
    clock.advance(8 * 86400 + 120)
    server.run_loop("history")
    samples = server.state.store.history.samples(0, clock.now())
    assert [sample.at for sample in samples] == [sample_slot(clock.now())]


def test_any_replica_serves_the_history(server, api, clock, store_url, settings):
    register(api, "w1", gpus=2)
    server.run_loop("history")
    replica_store = open_store(store_url)
    try:
        with (
            ServerThread(replica_store, settings, clock) as replica,
            httpx.Client(base_url=replica.url) as other,
        ):
            replica.run_loop("history")  # the same minute, from the other replica: written once
            assert len(replica.state.store.history.samples(0, clock.now())) == 1
            assert polylines(other.get("/").text) == polylines(api.get("/").text) != []
    finally:
        replica_store.close()


def test_the_interval_and_the_retention_are_settings(server, api, clock, settings):
    settings.history_interval_s = 300
    settings.history_retention_days = 2
    assert "no sample yet: the server samples every 5 minutes" in api.get("/").text
    register(api, "w1", gpus=2)
    server.run_loop("history")
    first = clock.now()
    clock.advance(240)  # within the same five minutes, unless the first sample was late in them
    server.run_loop("history")
    clock.advance(300)
    server.run_loop("history")
    samples = server.state.store.history.samples(0, clock.now())
    assert [sample.at for sample in samples][-1] == sample_slot(clock.now(), 300)
    assert all(sample.at % 300 == 0 for sample in samples)
    assert len(samples) == len({sample_slot(at, 300) for at in (first, first + 240, first + 540)})
    queue, gpus = polylines(api.get("/").text)  # one line a chart: five minutes apart is no gap here
    assert len(queue) == len(gpus) == len(samples) >= 2
    clock.advance(2 * 86400 + 600)
    server.run_loop("history")
    assert [sample.at for sample in server.state.store.history.samples(0, clock.now())] == [
        sample_slot(clock.now(), 300)
    ], "the samples older than two days are gone"
