"""The dashboard in a real browser (Chromium through Playwright) against a real server and real
workers: every page loads; a job followed from pending to done with its logs appearing live; a
running job cancelled from its page; the pages work from the keyboard and ask for nothing offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from corral.client import Client
from tests.e2e.conftest import wait_for, wait_status

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def assert_clean(page) -> None:
    assert page.foreign_requests == [], f"requests to other hosts: {page.foreign_requests}"
    assert page.console_errors == [], f"console errors: {page.console_errors}"


def test_every_page_loads(page, server, client: Client, start_worker):
    start_worker(server.url, "w1", "--gpus", "2", "--vram-mb", "1000", "--gpu-sampler", "none")
    wait_for(lambda: client.workers() or None, 15, "the worker to register")
    job = client.submit_body({"command": "echo hi", "name": "hello"})
    gang = client.submit_body({"command": "sleep 30", "gang_size": 2, "resources": {"cpus": 1}})
    wait_status(client, job["id"], {"done"}, 20)
    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Cluster")).to_be_visible()
    expect(page.get_by_test_id("gpus-free")).to_have_text(re.compile(r"\d+"))
    expect(page.get_by_role("cell", name="w1")).to_be_visible()
    page.get_by_role("link", name="Jobs", exact=True).click()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    expect(page.get_by_role("link", name=job["id"])).to_be_visible()
    page.get_by_label("Status").select_option("done")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=done"))
    expect(page.get_by_role("link", name=job["id"])).to_be_visible()
    page.get_by_role("link", name=job["id"]).click()
    expect(page.get_by_role("heading", name=re.compile(f"Job {job['id']}"))).to_be_visible()
    expect(page.locator("svg.timeline rect.bar").first).to_be_visible()
    page.goto(f"{server.url}/ui/gangs/{gang['gang_id']}")
    expect(page.get_by_role("heading", name=f"Gang {gang['gang_id']}")).to_be_visible()
    expect(page.get_by_role("heading", name="The drain story")).to_be_visible()
    page.get_by_role("link", name="Workers").click()
    expect(page.get_by_role("heading", name="w1")).to_be_visible()
    expect(page.locator("li.gpu[title^='GPU 0']")).to_be_visible()
    page.get_by_role("link", name="Pools").click()
    expect(page.get_by_role("heading", name="Pools")).to_be_visible()
    expect(page.get_by_role("link", name="default")).to_be_visible()
    client.cancel_gang(gang["gang_id"])
    assert_clean(page)


def test_a_job_from_pending_to_done_with_its_logs_live(
    page, server, client: Client, start_worker, tmp_path: Path
):
    gate = tmp_path / "gate"
    command = (
        f"echo first line; while [ ! -e {gate} ]; do sleep 0.1; done; echo second line; echo to stderr >&2"
    )
    job = client.submit_body({"command": command, "name": "watched"})
    page.goto(f"{server.url}/ui/jobs/{job['id']}")
    expect(page.locator(".job-head .status")).to_have_text("pending")
    start_worker(server.url, "w1")
    expect(page.locator(".job-head .status")).to_have_text("running", timeout=20_000)
    log = page.locator("#log")
    expect(log).to_have_text(re.compile(r"first line"), timeout=15_000)
    assert "second line" not in log.inner_text()
    gate.touch()
    expect(page.locator(".job-head .status")).to_have_text("done", timeout=20_000)
    expect(log).to_have_text(re.compile(r"first line\nsecond line\nto stderr"), timeout=15_000)
    expect(page.locator("#log-state")).to_have_text(re.compile("whole output"), timeout=15_000)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    assert_clean(page)


def test_cancel_a_running_job_from_its_page(page, server, client: Client, start_worker):
    start_worker(server.url, "w1")
    job = client.submit_body({"command": "echo started; sleep 60"})
    wait_status(client, job["id"], {"running"}, 20)
    page.goto(f"{server.url}/ui/jobs/{job['id']}")
    expect(page.locator("#log")).to_have_text(re.compile("started"), timeout=15_000)
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator(".job-head .status")).to_have_text("cancelled", timeout=20_000)
    assert client.get_job(job["id"])["status"] == "cancelled"
    assert_clean(page)


def test_the_pages_work_from_the_keyboard(page, server, client: Client):
    client.submit_body({"command": "true"})
    page.goto(server.url + "/ui/jobs")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.get_by_label("Pool").focus()
    page.keyboard.type("default")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"pool=default"))
    assert_clean(page)


def test_the_token_form_signs_in_under_the_pages_policy(page, start_server, tmp_path: Path):
    """With auth on, the token form's script (a file: the policy runs no inline script) keeps the
    token in the cookie and loads the page again, and nothing on the way breaks the policy."""
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-browser-1 user alice\n")
    tokens.chmod(0o600)
    secured = start_server("--auth-tokens", str(tokens))
    response = page.goto(secured.url + "/ui/jobs")
    assert response is not None and response.status == 401
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.get_by_label("Token").fill("tok-browser-1")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    # the first load's 401 (the form) is the one error the console may show
    assert page.console_errors == [
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    page.console_errors.clear()
    page.reload()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    assert_clean(page)
