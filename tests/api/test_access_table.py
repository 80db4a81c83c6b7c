"""Every route of the app, called by every role: who may call what (API.md "Authentication and roles").

``EXPECTED`` is the policy written a second time, independently of ``corral.server.auth.ACCESS``:
a route the app serves without a line here fails ``test_every_route_has_an_expectation`` (decide
who may call it, then add it to both tables), and a rule that drifts from this table fails
``test_every_route_and_role``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.config import ServerSettings
from corral.server import auth
from corral.store import open_store
from corral.testing.server import ServerThread

TOKENS = {
    "admin": "tok-admin-5f0e",
    "owner": "tok-alice-91aa",  # user alice: owns the job and the gang the routes name
    "user": "tok-bob-77c2",  # user bob: owns nothing
    "worker": "tok-w1-0b3d",  # worker w1: the worker the routes name
    "other_worker": "tok-w2-c4e8",  # worker w2
    "fleet": "tok-fleet-aa19",  # worker *: any worker id
}
TOKEN_FILE = f"""# token role name
{TOKENS["admin"]} admin root
{TOKENS["owner"]} user alice
{TOKENS["user"]}   user   bob    # trailing comment
{TOKENS["worker"]} worker w1
{TOKENS["other_worker"]} worker w2
{TOKENS["fleet"]} worker *
"""
CALLERS = (None, "bad", *TOKENS)

OPEN = "open"
USERS = frozenset({"admin", "owner", "user"})
OWNERS = frozenset({"admin", "owner"})
ADMINS = frozenset({"admin"})
WORKERS = frozenset({"admin", "worker", "fleet"})

#: (method, path) -> the callers that may call it (OPEN: anyone, no token)
EXPECTED: dict[tuple[str, str], frozenset[str] | str] = {
    ("GET", "/health"): OPEN,
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/metrics"): OPEN,
    ("GET", "/openapi.json"): USERS | WORKERS | {"other_worker"},
    ("GET", "/"): USERS,
    ("GET", "/ui/jobs"): USERS,
    ("GET", "/ui/jobs/{job_id}"): USERS,
    ("POST", "/ui/jobs/{job_id}/cancel"): OWNERS,
    ("GET", "/ui/gangs/{gang_id}"): USERS,
    ("POST", "/ui/gangs/{gang_id}/cancel"): OWNERS,
    ("GET", "/ui/workers"): USERS,
    ("GET", "/ui/pools"): USERS,
    ("GET", "/ui/static/{name}"): OPEN,
    ("GET", "/jobs/{job_id}/logs"): USERS,
    ("POST", "/jobs/{job_id}/logs"): WORKERS,
    ("POST", "/jobs"): USERS,
    ("POST", "/jobs/batch"): USERS,
    ("GET", "/jobs/batch"): USERS,
    ("GET", "/jobs"): USERS,
    ("GET", "/jobs/{job_id}"): USERS,
    ("GET", "/jobs/{job_id}/events"): USERS,
    ("GET", "/jobs/{job_id}/why"): USERS,
    ("POST", "/jobs/{job_id}/cancel"): OWNERS,
    ("GET", "/gangs/{gang_id}"): USERS,
    ("GET", "/gangs/{gang_id}/events"): USERS,
    ("GET", "/gangs/{gang_id}/why"): USERS,
    ("POST", "/gangs/{gang_id}/cancel"): OWNERS,
    ("GET", "/arrays/{array_id}"): USERS,
    ("GET", "/arrays/{array_id}/events"): USERS,
    ("GET", "/arrays/{array_id}/why"): USERS,
    ("POST", "/arrays/{array_id}/cancel"): OWNERS,
    ("POST", "/workers/register"): WORKERS,
    ("GET", "/workers"): USERS,
    ("GET", "/workers/{worker_id}"): USERS | WORKERS,
    ("POST", "/workers/{worker_id}/heartbeat"): WORKERS,
    ("POST", "/workers/{worker_id}/drain"): ADMINS,
    ("POST", "/workers/{worker_id}/undrain"): ADMINS,
    ("DELETE", "/workers/{worker_id}"): ADMINS,
    ("POST", "/workers/{worker_id}/leave"): WORKERS,
    ("POST", "/workers/{worker_id}/reports"): WORKERS,
    ("GET", "/jobs/next"): WORKERS,
    ("POST", "/jobs/{job_id}/heartbeat"): WORKERS,
    ("POST", "/jobs/{job_id}/done"): WORKERS,
    ("POST", "/jobs/{job_id}/fail"): WORKERS,
    ("POST", "/jobs/{job_id}/preempted"): WORKERS,
    ("POST", "/jobs/{job_id}/watchdog"): WORKERS,
    ("POST", "/jobs/{job_id}/checkpoint"): WORKERS,
    ("GET", "/jobs/{job_id}/checkpoint"): OWNERS | {"worker", "other_worker", "fleet"},
    ("GET", "/pools"): USERS,
    ("GET", "/pools/{path:path}"): USERS,
    ("PUT", "/pools/{path:path}"): ADMINS,
    ("DELETE", "/pools/{path:path}"): ADMINS,
    ("GET", "/usage"): USERS,
}

#: a body each route accepts (or at least parses past the access check)
BODIES: dict[tuple[str, str], object] = {
    ("POST", "/jobs"): {"command": "true"},
    ("POST", "/jobs/batch"): {"jobs": [{"command": "true"}]},
    ("POST", "/workers/register"): {"id": "w1", "resources": {"cpus": 8}},
    ("POST", "/jobs/{job_id}/fail"): {"exit_code": 1},
    ("POST", "/workers/{worker_id}/reports"): {
        "reports": [{"job_id": "j-x", "attempt": 1, "outcome": "done"}]
    },
    ("POST", "/jobs/{job_id}/watchdog"): {"kind": "stall"},
    ("PUT", "/pools/{path:path}"): {"weight": 1},
}


def headers_for(caller: str | None) -> dict[str, str]:
    if caller is None:
        return {}
    return {"Authorization": f"Bearer {TOKENS.get(caller, 'no-such-token')}"}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(TOKEN_FILE)
    return path


@pytest.fixture
def secured(store_url: str, clock, token_file: Path) -> Iterator[ServerThread]:
    store = open_store(store_url)
    settings = ServerSettings(auth_tokens=str(token_file))
    with ServerThread(store, settings, clock) as running:
        yield running
    store.close()


@pytest.fixture
def http(secured: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        yield client


def _world(http: httpx.Client) -> dict[str, str]:
    """A worker w1 running alice's job, a gang and an array of alice's: what the routes' parameters name."""
    admin, alice, w1 = headers_for("admin"), headers_for("owner"), headers_for("worker")
    assert (
        http.post("/workers/register", json=BODIES["POST", "/workers/register"], headers=w1).status_code
        == 201
    )
    job = http.post("/jobs", json={"command": "true", "env": {"K": "v"}}, headers=alice).json()
    claimed = http.get("/jobs/next", params={"worker_id": "w1"}, headers=w1)
    assert claimed.status_code == 200, claimed.text
    gang = http.post("/jobs", json={"command": "true", "gang_size": 2}, headers=alice).json()
    array = http.post("/jobs", json={"command": "true", "array": "0-1"}, headers=alice).json()
    assert http.put("/pools/team", json={"weight": 1}, headers=admin).status_code == 200
    return {
        "job_id": job["id"],
        "gang_id": gang["gang_id"],
        "array_id": array["array_id"],
        "worker_id": "w1",
        "path": "team",
    }


def _call(http: httpx.Client, method: str, path: str, world: dict[str, str], caller: str | None):
    url = path.replace("{path:path}", world["path"]).replace("{name}", "corral.css")
    for name in ("job_id", "gang_id", "array_id", "worker_id"):
        url = url.replace("{" + name + "}", world[name])
    params = {"worker_id": "w1", "attempt": "1"} if "{job_id}" in path or path == "/jobs/next" else None
    body = BODIES.get((method, path))
    if path == "/jobs/{job_id}/logs" and method == "POST":
        return http.post(
            url, params={**(params or {}), "offset": "0"}, content=b"out", headers=headers_for(caller)
        )
    if path == "/jobs/{job_id}/checkpoint" and method == "POST":
        return http.post(url, params=params, content=b"state", headers=headers_for(caller))
    return http.request(method, url, params=params, json=body, headers=headers_for(caller))


def test_every_route_has_an_expectation(secured: ServerThread):
    served = set(auth.route_keys(secured.app.routes))
    assert served - set(EXPECTED) == set(), "a route without a line in EXPECTED: decide who may call it"
    assert set(EXPECTED) - served == set(), "EXPECTED names a route the app does not serve"
    assert served == set(auth.ACCESS), "auth.ACCESS and the app's routes differ"


def test_every_route_and_role(http: httpx.Client):
    world = _world(http)
    wrong = []
    for (method, path), allowed in EXPECTED.items():
        for caller in CALLERS:
            response = _call(http, method, path, world, caller)
            status = response.status_code
            if allowed == OPEN:
                ok = status not in (401, 403)
            elif (caller is None or caller == "bad") and method == "GET" and auth.dashboard_path(path):
                ok = status == 401 and 'id="token-form"' in response.text  # a page: the sign-in page
            elif caller is None or caller == "bad":
                ok = status == 401 and response.json()["error"]["code"] == "unauthenticated"
            elif caller in allowed:
                ok = status not in (401, 403)
            else:
                ok = status == 403 and response.json()["error"]["code"] == "forbidden"
            if not ok:
                wrong.append(f"{method} {path} as {caller}: {status} {response.text[:120]}")
    assert wrong == []


def test_a_worker_token_acts_only_as_its_worker(http: httpx.Client):
    w1 = headers_for("worker")
    assert http.post("/workers/register", json={"id": "w2"}, headers=w1).status_code == 403
    assert http.get("/jobs/next", params={"worker_id": "w2"}, headers=w1).status_code == 403
    # with no id, a bound token registers as its own worker
    assert http.post("/workers/register", json={}, headers=w1).json()["id"] == "w1"
    fleet = headers_for("fleet")
    assert http.post("/workers/register", json={"id": "w9"}, headers=fleet).status_code == 201


def test_a_jobs_user_is_the_tokens_name_and_its_env_is_kept_from_others(http: httpx.Client):
    job = http.post(
        "/jobs",
        json={"command": "true", "user": "mallory", "env": {"API_KEY": "s3cret"}},
        headers=headers_for("owner"),
    ).json()
    assert job["user"] == "alice"
    assert job["env"] == {"API_KEY": "s3cret"}
    for caller, seen in (("owner", "s3cret"), ("admin", "s3cret"), ("user", auth.HIDDEN)):
        headers = headers_for(caller)
        assert http.get(f"/jobs/{job['id']}", headers=headers).json()["env"] == {"API_KEY": seen}
        listed = http.get("/jobs", headers=headers).json()["items"]
        assert [item["env"] for item in listed] == [{"API_KEY": seen}]
    gang = http.post(
        "/jobs", json={"command": "true", "gang_size": 2, "env": {"T": "x"}}, headers=headers_for("owner")
    ).json()
    tasks = http.get(f"/gangs/{gang['gang_id']}", headers=headers_for("user")).json()["tasks"]
    assert [task["env"] for task in tasks] == [{"T": auth.HIDDEN}] * 2


def test_the_cookie_carries_a_token_too(http: httpx.Client):
    cookie = f"theme=dark; corral_token={TOKENS['user']}"
    assert http.get("/jobs", headers={"Cookie": cookie}).status_code == 200
    assert http.get("/jobs", headers={"Cookie": "corral_token=nope"}).status_code == 401
    # a change made with the cookie must come from this site (no cross-site request forgery)
    owner = f"corral_token={TOKENS['owner']}"
    job = http.post("/jobs", json={"command": "true"}, headers=headers_for("owner")).json()
    forged = http.post(
        f"/ui/jobs/{job['id']}/cancel", headers={"Cookie": owner, "Origin": "https://evil.example"}
    )
    assert forged.status_code == 403
    same_site = http.post(
        f"/ui/jobs/{job['id']}/cancel",
        headers={"Cookie": owner, "Origin": http.base_url.scheme + "://" + http.base_url.netloc.decode()},
    )
    assert same_site.status_code == 303
    assert http.get(f"/jobs/{job['id']}", headers={"Cookie": owner}).json()["status"] == "cancelled"


def test_the_cookie_is_refused_off_the_dashboard_and_the_reads(http: httpx.Client):
    """A browser sends the cookie with any request to the server, whatever page made it: the job
    protocol, the worker routes and the API's changes take a bearer token only (issue 24)."""
    world = _world(http)
    job_id = world["job_id"]
    same_site = http.base_url.scheme + "://" + http.base_url.netloc.decode()

    def cookie(caller: str) -> dict[str, str]:
        return {"Cookie": f"corral_token={TOKENS[caller]}", "Origin": same_site}

    refused = [
        ("GET", "/jobs/next", {"worker_id": "w1"}, None, "fleet"),
        ("POST", f"/jobs/{job_id}/heartbeat", {"worker_id": "w1", "attempt": "1"}, None, "worker"),
        ("POST", f"/jobs/{job_id}/done", {"worker_id": "w1", "attempt": "1"}, None, "admin"),
        ("POST", "/workers/register", None, {"id": "w1"}, "worker"),
        ("POST", "/workers/w1/heartbeat", None, {}, "fleet"),
        ("GET", "/workers/w1", None, None, "worker"),
        ("POST", "/jobs", None, {"command": "true"}, "owner"),
        ("POST", "/jobs/batch", None, {"jobs": [{"command": "true"}]}, "owner"),
        ("POST", f"/jobs/{job_id}/cancel", None, None, "owner"),
        ("PUT", "/pools/team", None, {"weight": 2}, "admin"),
        ("POST", "/workers/w1/drain", None, None, "admin"),
    ]
    for method, path, params, body, caller in refused:
        response = http.request(method, path, params=params, json=body, headers=cookie(caller))
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"]["code"] == "unauthenticated"
        assert "Bearer" in response.json()["error"]["message"]
    assert http.get(f"/jobs/{job_id}", headers=headers_for("owner")).json()["status"] == "running"
    assert http.get("/pools/team", headers=headers_for("admin")).json()["weight"] == 1
    # the dashboard's own pages and the reads its pages make still take it
    for path in ("/", "/ui/jobs", f"/ui/jobs/{job_id}", "/jobs", f"/jobs/{job_id}/logs"):
        assert http.get(path, headers=cookie("user")).status_code == 200, path
    assert http.post(f"/ui/jobs/{job_id}/cancel", headers=cookie("owner")).status_code == 303
    # a bearer token beside the cookie is what counts
    claimed = http.get(
        "/jobs/next", params={"worker_id": "w1"}, headers={**cookie("fleet"), **headers_for("fleet")}
    )
    assert claimed.status_code in (200, 204)


def test_the_dashboard_hides_env_values_as_the_api_does(http: httpx.Client):
    alice, bob = headers_for("owner"), headers_for("user")
    job = http.post("/jobs", json={"command": "true", "env": {"API_KEY": "s3cret-1"}}, headers=alice).json()
    gang = http.post(
        "/jobs", json={"command": "true", "gang_size": 2, "env": {"T": "s3cret-2"}}, headers=alice
    ).json()
    for job_id in (job["id"], *gang["tasks"]):
        for params in ({}, {"partial": "1"}):
            page = http.get(f"/ui/jobs/{job_id}", params=params, headers=bob)
            assert page.status_code == 200
            assert "s3cret" not in page.text, (job_id, params)
            assert f"={auth.HIDDEN}".replace("<", "&lt;").replace(">", "&gt;") in page.text
            assert "s3cret" in http.get(f"/ui/jobs/{job_id}", params=params, headers=alice).text
        assert http.get(f"/jobs/{job_id}", headers=bob).json()["env"] in (
            {"API_KEY": auth.HIDDEN},
            {"T": auth.HIDDEN},
        )
    gang_page = http.get(f"/ui/gangs/{gang['gang_id']}", headers=bob).text
    assert "s3cret" not in gang_page


def test_a_revoked_token_fails_within_seconds_without_a_restart(http: httpx.Client, token_file: Path):
    assert http.get("/jobs", headers=headers_for("user")).status_code == 200
    token_file.write_text(TOKEN_FILE.replace(TOKENS["user"], "#"))
    deadline = time.monotonic() + 5
    while http.get("/jobs", headers=headers_for("user")).status_code != 401:
        assert time.monotonic() < deadline, "a revoked token still works after 5 s"
        time.sleep(0.1)
    token_file.write_text(TOKEN_FILE + "tok-new-1 user carol\n")
    deadline = time.monotonic() + 5
    while http.get("/jobs", headers={"Authorization": "Bearer tok-new-1"}).status_code != 200:
        assert time.monotonic() < deadline, "a new token is still refused after 5 s"
        time.sleep(0.1)
    token_file.unlink()  # an unreadable file refuses everyone (fail closed)
    deadline = time.monotonic() + 5
    while http.get("/jobs", headers=headers_for("admin")).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert http.get("/health").status_code == 200


def test_no_token_or_env_value_reaches_the_log(http: httpx.Client, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    world = _world(http)
    for method, path in EXPECTED:
        for caller in CALLERS:
            _call(http, method, path, world, caller)
    http.post(
        "/jobs", json={"command": "true", "env": {"PASSWORD": "hunter2-value"}}, headers=headers_for("owner")
    )
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    for token in TOKENS.values():
        assert token not in logged
    assert "hunter2-value" not in logged


def test_bad_lines_of_the_token_file_are_skipped_by_number(caplog: pytest.LogCaptureFixture):
    entries = auth.parse_token_file("good admin root\nsecret-xyz superuser eve\nonly-two user\n")
    assert [principal.name for _, principal in entries] == ["root"]
    assert "secret-xyz" not in caplog.text
    assert [record.__dict__["line"] for record in caplog.records] == [2, 3]


def test_tokens_are_compared_in_constant_time(tmp_path: Path):
    """Every entry is compared with ``hmac.compare_digest``, with no early exit (by construction:
    this checks that a match early in the file and one at its end walk the same entries)."""
    path = tmp_path / "tokens"
    path.write_text("".join(f"t{index} user u{index}\n" for index in range(50)))
    tokens = auth.TokenFile(path)
    calls = []
    original = auth.hmac.compare_digest

    def counting(first: bytes, second: bytes) -> bool:
        calls.append(1)
        return original(first, second)

    auth.hmac.compare_digest = counting  # type: ignore[assignment]
    try:
        for token in ("t0", "t49", "missing"):
            calls.clear()
            tokens.principal(token)
            assert len(calls) == 50
    finally:
        auth.hmac.compare_digest = original  # type: ignore[assignment]


def test_the_dashboard_asks_a_browser_for_a_token_and_acts_with_its_role(http: httpx.Client):
    page = http.get("/ui/jobs", headers={"Accept": "text/html"})
    assert page.status_code == 401
    assert "<form" in page.text and '<script src="/ui/static/login.js">' in page.text
    assert page.headers["x-frame-options"] == "DENY"
    assert "script-src 'self';" in page.headers["content-security-policy"]
    script = http.get("/ui/static/login.js")
    assert script.headers["content-type"].startswith("text/javascript") and "corral_token" in script.text
    assert "Secure" not in page.text, "a Secure cookie is never sent back over plain HTTP"
    for accept in ({}, {"Accept": "*/*"}):  # curl's, or none: still the page, never a JSON 401
        plain = http.get("/", headers=accept)
        assert plain.status_code == 401 and 'id="token-form"' in plain.text, accept
    json_only = http.get("/ui/jobs", headers={"Accept": "application/json"})
    assert json_only.json()["error"]["code"] == "unauthenticated", "a script asking for JSON gets JSON"
    assert "not accepted" not in page.text
    refused = http.get("/ui/jobs", headers={"Cookie": "corral_token=mistyped", "Accept": "text/html"})
    assert refused.status_code == 401 and "not accepted" in refused.text, "a bad cookie is said so"
    cookie = {"Cookie": f"corral_token={TOKENS['user']}", "Accept": "text/html"}
    assert http.get("/ui/jobs", headers=cookie).status_code == 200
    job = http.post("/jobs", json={"command": "true"}, headers=headers_for("owner")).json()
    assert http.post(f"/ui/jobs/{job['id']}/cancel", headers=cookie).status_code == 403, "not bob's job"


def test_an_idempotency_key_is_its_submitters_own(http: httpx.Client):
    """Bob's ``Idempotency-Key`` that alice used first is bob's own key (issue 24): neither alice's
    job handed to him nor a 409 that tells him the key exists."""
    alice, bob = headers_for("owner"), headers_for("user")
    body = {"command": "train", "env": {"TOKEN": "alice-s3cret"}}
    first = http.post("/jobs", json=body, headers={**alice, "Idempotency-Key": "k-1"})
    assert first.status_code == 201
    again = http.post("/jobs", json=body, headers={**alice, "Idempotency-Key": "k-1"})
    assert again.json()["id"] == first.json()["id"], "alice's retry is answered her first job"
    same_body = http.post("/jobs", json=body, headers={**bob, "Idempotency-Key": "k-1"})
    assert same_body.status_code == 201
    assert same_body.json()["id"] != first.json()["id"] and same_body.json()["user"] == "bob"
    other_body = http.post("/jobs", json={"command": "other"}, headers={**bob, "Idempotency-Key": "k-1"})
    assert other_body.status_code == 409, "bob's own key, first used with another body"
    batch = http.post("/jobs/batch", json={"jobs": [body]}, headers={**bob, "Idempotency-Key": "k-2"})
    assert batch.status_code == 201
    mine = http.post("/jobs/batch", json={"jobs": [body]}, headers={**alice, "Idempotency-Key": "k-2"})
    assert mine.status_code == 201 and mine.json()["items"][0]["user"] == "alice"
    conflict = http.post("/jobs", json={"command": "x"}, headers={**alice, "Idempotency-Key": "k-1"})
    assert conflict.status_code == 409, "a different body under alice's own key is still a conflict"
