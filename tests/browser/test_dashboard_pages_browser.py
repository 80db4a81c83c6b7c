"""The dashboard's pages of issue 23 (item 7) in Chromium against a real server and worker: the
sign-in page on ``/`` with auth on, the jobs newest first by name, the job page's field groups and
timeline, the pools tree with its fair-share bars, and the overview's last 24 hours."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from corral.client import Client
from corral.domain.history import ClusterSample, sample_slot
from corral.store import open_store
from tests.browser.test_dashboard_browser import assert_clean
from tests.e2e.conftest import wait_status

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def test_the_overview_asks_for_a_token_then_signs_in(page, start_server, tmp_path: Path):
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-browser-2 admin root\n")
    tokens.chmod(0o600)
    secured = start_server("--auth-tokens", str(tokens))
    response = page.goto(secured.url + "/")
    assert response is not None and response.status == 401
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text(re.compile("not accepted"))
    page.get_by_label("Token").fill("tok-browser-2")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Cluster")).to_be_visible()
    expect(page.get_by_role("alert")).to_have_count(0)
    page.console_errors.clear()  # the two 401s of the sign-in page
    page.goto(secured.url + "/ui/pools")
    expect(page.get_by_role("heading", name="Pools")).to_be_visible()
    assert_clean(page)


def test_jobs_newest_first_by_name_and_the_job_page_readable(page, server, client: Client, start_worker):
    start_worker(server.url, "w1")
    first = client.submit_body({"command": "echo one", "name": "prep-data"})
    wait_status(client, first["id"], {"done"}, 20)
    second = client.submit_body({"command": "echo two; sleep 1"})
    wait_status(client, second["id"], {"done"}, 20)
    page.goto(server.url + "/ui/jobs")
    rows = page.locator("table.jobs tbody tr")
    expect(rows.nth(0)).to_contain_text(second["id"])
    expect(rows.nth(0).locator(".job-name .name")).to_have_text("echo two; sleep 1")
    expect(rows.nth(1).locator(".job-name .name")).to_have_text("prep-data")
    rows.nth(0).get_by_role("link", name=second["id"]).click()
    for group in ("Identity", "Resources", "Scheduling", "Timing"):
        expect(page.get_by_role("heading", name=group, exact=True)).to_be_visible()
    timeline = page.get_by_test_id("timeline")
    expect(timeline).to_be_visible()
    expect(timeline.locator("rect.tl-running")).to_have_count(1)
    expect(timeline.locator("text.tick").first).to_have_text("0")
    assert timeline.locator("text.tick").count() >= 3, "a time axis, with round ticks"
    box = timeline.bounding_box()
    assert box is not None and box["width"] > 1000, "the timeline spans the page"
    assert_clean(page)


def test_an_arrays_tasks_and_each_jobs_reason_on_the_jobs_page(page, server, client: Client):
    sweep = client.submit("echo x", array="0-1", name="sweep")
    lone = client.submit("echo y", name="lone")
    page.goto(server.url + "/ui/jobs")
    expect(page.locator("table.jobs tbody tr").first.locator(".job-reason")).to_contain_text("queued: ")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "no sideways scroll"
    page.get_by_role("link", name=sweep.id).first.click()
    expect(page).to_have_url(re.compile(r"array_id=" + sweep.id))
    rows = page.locator("table.jobs tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text=lone.id)).to_have_count(0)
    expect(page.get_by_label("Array")).to_have_value(sweep.id)
    assert_clean(page)


def test_the_pools_tree_with_fair_share_bars(page, server, client: Client, start_worker):
    start_worker(server.url, "w1", "--gpus", "4", "--gpu-sampler", "none")
    with httpx.Client(base_url=server.url) as http:
        http.put("/pools/research", json={"weight": 3}).raise_for_status()
        http.put("/pools/research/vision", json={}).raise_for_status()
    job = client.submit_body({"command": "sleep 30", "pool": "research/vision", "resources": {"gpus": 2}})
    wait_status(client, job["id"], {"running"}, 20)
    page.goto(server.url + "/ui/pools")
    tree = page.get_by_test_id("pool-tree")
    parent = tree.get_by_role("link", name="research", exact=True).bounding_box()
    child = tree.get_by_role("link", name="vision", exact=True).bounding_box()
    assert parent is not None and child is not None and child["x"] > parent["x"] + 10, "indented under it"
    vision = tree.locator('tr[data-pool="research/vision"]')
    expect(vision.get_by_role("img")).to_have_attribute("aria-label", re.compile(r"usage 50% of the cluster"))
    usage = vision.locator(".share-usage").bounding_box()
    bar = vision.locator(".share-bar").bounding_box()
    assert usage is not None and bar is not None and abs(usage["width"] - bar["width"] / 2) < 3
    client.cancel(job["id"])
    assert_clean(page)


def test_the_overview_draws_the_last_24_hours(page, server, tmp_path: Path):
    """Six hours of samples, written as another replica would (the server's own loop samples once
    a minute: a test does not wait for it), drawn by the server's overview."""
    store = open_store(f"sqlite:///{tmp_path}/c0.db")
    try:
        minute = sample_slot(time.time())
        for ago in range(360, 0, -1):
            queued = 10 if ago > 120 else 3
            store.history.record_sample(ClusterSample(minute - 60 * ago, queued, 2, 8, 6))
    finally:
        store.close()
    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Last 24 hours")).to_be_visible()
    queue = page.get_by_test_id("history-1")
    expect(queue).to_contain_text("now 3 jobs waiting, peak 10")
    expect(queue.locator("polyline.series")).to_have_count(1)
    gpus = page.get_by_test_id("history-2")
    expect(gpus).to_contain_text("now 6 GPUs held")
    expect(gpus.locator("polyline.ceiling")).to_have_count(1)
    line = queue.locator("polyline.series").bounding_box()
    chart = queue.locator("svg").bounding_box()
    assert line is not None and chart is not None
    assert line["width"] > chart["width"] * 0.2, "six hours of a day's chart"
    assert_clean(page)
