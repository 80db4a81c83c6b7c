"""The dashboard's pages over HTTP (the browser tests drive them in Chromium: tests/browser/): each
page renders with what it must show, the live part alone with ``partial=1``, cancel by form post,
no external request anywhere, and fast on 10,000 jobs."""

from __future__ import annotations

import re

from tests.api.conftest import claim, register, submit
from tests.helpers import admitted_and_running, send

PAGES = ("/", "/ui/jobs", "/ui/workers", "/ui/pools")


def test_every_page_renders_and_links_nothing_external(server, api):
    register(api, "solo", gpus=2, vram_mb=1000)
    submit(api, resources={"gpus": 1}, name="train-a")
    job = claim(api, "solo")
    send(api, job, 0, b"epoch 1\n")
    gang, _ = admitted_and_running(api, server)
    pages = [*PAGES, f"/ui/jobs/{job['id']}", f"/ui/gangs/{gang['gang_id']}"]
    for page in pages:
        response = api.get(page)
        assert response.status_code == 200, page
        assert response.headers["content-type"].startswith("text/html")
        html = response.text
        assert "<main" in html and "<h1>" in html, page
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), f"an external reference on {page}"
        partial = api.get(page, params={"partial": "1"}).text
        assert "<html" not in partial and partial.strip(), page
    overview = api.get("/").text
    assert 'data-testid="gpus-busy">3<' in overview  # solo's job and the gang's two ranks
    job_page = api.get(f"/ui/jobs/{job['id']}").text
    assert "train-a" in job_page and "Cancel job" in job_page and 'data-job="' + job["id"] in job_page
    workers_page = api.get("/ui/workers").text
    assert workers_page.count('class="gpu gpu-busy" title=') == 3 and "solo" in workers_page
    assert api.get("/ui/static/corral.js").headers["content-type"].startswith("text/javascript")
    assert api.get("/ui/static/nope.js").status_code == 404
    assert api.get("/ui/jobs/j-nope").status_code == 404


def test_every_page_forbids_frames_and_inline_script(server, api):
    """Clickjacking and an injected script (issue 24): every HTML page, its live part and its 404
    page say ``X-Frame-Options: DENY`` and a policy that runs the server's own script files only,
    and no page holds an inline script or event handler that the policy would stop."""
    register(api, "solo", gpus=1)
    job = submit(api, resources={"gpus": 1})
    gang, _ = admitted_and_running(api, server)
    pages = [*PAGES, f"/ui/jobs/{job['id']}", f"/ui/gangs/{gang['gang_id']}", "/ui/jobs/j-nope"]
    for page in pages:
        for params in ({}, {"partial": "1"}):
            response = api.get(page, params=params)
            assert response.headers["content-type"].startswith("text/html"), page
            assert response.headers["x-frame-options"] == "DENY", page
            policy = dict(
                directive.strip().split(" ", 1)
                for directive in response.headers["content-security-policy"].split(";")
            )
            assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'", page
            assert not re.search(r"<script(?![^>]*\bsrc=)", response.text), f"an inline script on {page}"
            assert not re.search(r"""\son[a-z]+\s*=""", response.text), f"an inline event handler on {page}"
    assert "x-frame-options" not in api.get("/jobs").headers, "the JSON API is not a page"


def test_filters_and_cursor_pages(server, api):
    for index in range(3):
        submit(api, pool=f"team{index % 2}")
    page = api.get("/ui/jobs", params={"pool": "team1"}).text
    assert page.count('href="/ui/jobs/j-') == 1
    assert api.get("/ui/jobs", params={"status": "bogus"}).status_code == 400


def test_cancel_from_the_page_is_a_form_post(server, api):
    job = submit(api)
    response = api.post(f"/ui/jobs/{job['id']}/cancel")
    assert response.status_code == 303 and response.headers["location"] == f"/ui/jobs/{job['id']}"
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "cancelled"
    assert api.post(f"/ui/jobs/{job['id']}/cancel").status_code == 303  # a second click changes nothing


def test_pages_render_on_ten_thousand_jobs(server, api):
    """Every page answers on a queue of 10,000 jobs (how fast is a benchmark's question, not a test's)."""
    register(api, "w1", cpus=64, memory_mb=65536)
    jobs = [{"command": "true", "pool": f"p{index % 7}"} for index in range(10_000)]
    api.post("/jobs/batch", json={"jobs": jobs}, timeout=120).raise_for_status()
    for page in PAGES:
        assert api.get(page).status_code == 200, page
    assert 'data-testid="jobs-pending">10000<' in api.get("/").text
