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


def test_jobs_newest_first_by_name_or_command(server, api, clock):
    first = submit(api, name="prep-data")
    clock.advance(1)
    second = submit(api, command="python train.py --epochs 3")
    page = api.get("/ui/jobs").text
    assert page.index(second["id"]) < page.index(first["id"]), "what was just submitted comes first"
    assert "prep-data" in page and "python train.py --epochs 3" in page, "a name, else the command"


def test_pools_are_a_tree_with_fair_share_bars(server, api):
    register(api, "w1", gpus=4)
    api.put("/pools/research", json={"weight": 3}).raise_for_status()
    api.put("/pools/research/vision", json={}).raise_for_status()
    submit(api, pool="research/vision", resources={"gpus": 2})
    claim(api, "w1")
    submit(api, pool="ops", resources={"gpus": 1})
    page = api.get("/ui/pools").text
    rows = re.findall(r'<tr class="pool-(\w+)" data-pool="([^"]+)" data-depth="(\d)"', page)
    tree = [(path, int(depth)) for _, path, depth in rows]
    assert tree == [("default", 0), ("ops", 0), ("research", 0), ("research/vision", 1)]
    assert page.count('class="share-bar"') == 4
    vision = page[page.index('data-pool="research/vision"') :]
    assert ">vision</a>" in vision and "padding-left: 2.0em" in vision, "indented under its parent"


def test_the_job_page_groups_its_fields_and_draws_a_timeline_with_an_axis(server, api, clock):
    register(api, "w1", gpus=1)
    job = submit(api, name="train", resources={"gpus": 1})
    clock.advance(30)
    claim(api, "w1")
    clock.advance(90)
    page = api.get(f"/ui/jobs/{job['id']}").text
    groups = re.findall(r'<h3 id="group-\d+">(\w+)</h3>', page)
    assert groups[:4] == ["Identity", "Resources", "Scheduling", "Timing"]
    identity = page[page.index(">Identity<") : page.index(">Resources<")]
    assert "command" in identity and "train" in identity and "submitted at" not in identity
    timing = page[page.index(">Timing<") :]
    assert "submitted at" in timing and "started at" in timing
    timeline = page[page.index('data-testid="timeline"') : page.index("</svg>")]
    assert timeline.count('<rect class="bar') == 2, "pending, then running up to now"
    assert re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', timeline) == [
        "0", "+15 s", "+30 s", "+45 s", "+60 s", "+75 s", "+90 s", "+105 s", "+120 s",  # one unit
    ]  # fmt: skip


def test_the_jobs_page_shows_arrays_and_each_jobs_reason_as_the_api_words_it(server, api):
    register(api, "w1", gpus=2)
    array = submit(api, name="sweep", array="0-2")
    other = submit(api, name="lone")
    too_big = submit(api, name="too-big", resources={"gpus": 64})
    waiting = submit(api, name="then", after=[{"id": array["array_id"], "when": "ok"}])
    page = api.get("/ui/jobs").text
    assert page.count(f'<a href="/ui/jobs?array_id={array["array_id"]}">') == 3
    assert f"{array['array_id']}</a> [2]" in page, "each task with its index"
    reason = api.get(f"/jobs/{too_big['id']}").json()["reason"]
    assert reason["code"] == "unschedulable"
    assert f'title="unschedulable: {reason["message"]}"' in page, "the words `corral jobs --wide` prints"
    assert "dependency: waiting for the jobs it runs after" in page
    tasks = api.get("/ui/jobs", params={"array_id": array["array_id"]}).text
    assert all(task in tasks for task in array["tasks"]) and other["id"] not in tasks
    assert f'name="array_id" value="{array["array_id"]}"' in tasks, "the filter kept in its field"
    job_page = api.get(f"/ui/jobs/{waiting['id']}").text
    assert f'<a href="/ui/jobs?array_id={array["array_id"]}">' in job_page, "the array's tasks, not its JSON"
    assert f"ok {array['array_id']}" in job_page and "{&#39;id&#39;" not in job_page, "after, as words"
    task_page = api.get(f"/ui/jobs/{array['tasks'][0]}").text
    assert f'of array <a href="/ui/jobs?array_id={array["array_id"]}">' in task_page
