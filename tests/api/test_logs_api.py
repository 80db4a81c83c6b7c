"""``POST /jobs/{id}/logs`` (a fenced worker report) and ``GET /jobs/{id}/logs`` (plain and follow)."""

from __future__ import annotations

import threading
import time

import httpx

from corral.config import ServerSettings
from corral.store import open_store
from corral.testing.server import ServerThread
from tests.api.conftest import claim, error_code, register, submit
from tests.helpers import send


def test_chunks_append_once_and_read_back_as_text(api):
    register(api)
    submit(api)
    job = claim(api)
    first = send(api, job, 0, b"step 1\n")
    assert first.status_code == 200
    assert first.json() == {"job_id": job["id"], "attempt": 1, "size": 7, "accepted": 7, "dropped": 0}
    assert send(api, job, 0, b"step 1\n").json()["accepted"] == 0  # a retry
    assert send(api, job, 7, b"step 2\n").json()["size"] == 14
    read = api.get(f"/jobs/{job['id']}/logs")
    assert read.status_code == 200
    assert read.headers["content-type"].startswith("text/plain")
    assert read.text == "step 1\nstep 2\n"
    assert (read.headers["x-corral-attempt"], read.headers["x-corral-log-size"]) == ("1", "14")
    assert api.get(f"/jobs/{job['id']}/logs", params={"offset": 7}).text == "step 2\n"
    assert api.get(f"/jobs/{job['id']}/logs", params={"attempt": 3}).text == ""


def test_a_stale_attempt_is_refused_and_bad_input_is_a_400(api):
    register(api)
    submit(api)
    job = claim(api)
    stale = send(api, job, 0, b"x", attempt=2)
    assert (stale.status_code, error_code(stale)) == (409, "stale_attempt")
    gap = send(api, job, 5, b"x")
    assert (gap.status_code, error_code(gap)) == (409, "conflict")
    for params in ({"worker_id": "w1", "attempt": 1}, {"worker_id": "w1", "attempt": 1, "offset": -1}):
        bad = api.post(f"/jobs/{job['id']}/logs", params=params, content=b"x")
        assert (bad.status_code, error_code(bad)) == (400, "invalid_request")
    assert api.get(f"/jobs/{job['id']}/logs", params={"offset": -2}).status_code == 400
    missing = api.get("/jobs/j-nope/logs")
    assert (missing.status_code, error_code(missing)) == (404, "not_found")
    assert api.get(f"/jobs/{job['id']}/logs").text == ""


def test_the_cap_drops_the_oldest_bytes_and_says_so(server, settings, api):
    settings.log_max_bytes = 10
    register(api)
    submit(api)
    job = claim(api)
    answer = send(api, job, 0, b"0123456789abcdef").json()
    assert (answer["size"], answer["dropped"]) == (16, 6)
    read = api.get(f"/jobs/{job['id']}/logs")
    assert read.text == "6789abcdef"
    assert (read.headers["x-corral-log-start"], read.headers["x-corral-log-dropped"]) == ("6", "6")


def test_follow_streams_new_output_and_ends_with_the_attempt(server, api):
    register(api)
    submit(api)
    job = claim(api)
    send(api, job, 0, b"hello\n")
    received: list[bytes] = []

    def follow():
        with (
            httpx.Client(base_url=server.url, timeout=10) as client,
            client.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": 1}) as response,
        ):
            received.extend(response.iter_raw())

    reader = threading.Thread(target=follow)
    reader.start()
    deadline = time.monotonic() + 5
    while b"".join(received) != b"hello\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"".join(received) == b"hello\n"
    send(api, job, 6, b"world\n")
    params = {"worker_id": job["worker_id"], "attempt": job["attempt"]}
    api.post(f"/jobs/{job['id']}/done", params=params).raise_for_status()
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert b"".join(received) == b"hello\nworld\n"


def test_a_stored_chunk_reaches_a_follow_on_the_same_server_without_waiting_for_the_next_poll(server, api):
    """The append nudges the job's watch: with its polls an hour apart, the follow still gets the
    chunk (issue 23: ``logs -f`` showed output late; the latency is in bench/log_latency.py)."""
    server.state.log_watches.poll_s = 3600
    register(api)
    submit(api)
    job = claim(api)
    received: list[bytes] = []
    got = threading.Event()

    def follow():
        with (
            httpx.Client(base_url=server.url, timeout=30) as client,
            client.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": 1}) as response,
        ):
            for data in response.iter_raw():
                received.append(data)
                if b"".join(received) == b"hello\n":
                    got.set()
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    # the watch polled once and pauses for an hour
    wait_until(lambda: getattr(server.state.log_watches.watches.get(job["id"]), "latest", None) is not None)
    send(api, job, 0, b"hello\n")
    assert got.wait(20), "the follow did not get the chunk before the watch's next poll"
    reader.join(timeout=5)


def test_the_reaper_removes_logs_past_retention(server, settings, clock, api):
    settings.retention_days = 1
    register(api)
    submit(api)
    job = claim(api)
    send(api, job, 0, b"kept a day\n")
    params = {"worker_id": job["worker_id"], "attempt": job["attempt"]}
    api.post(f"/jobs/{job['id']}/done", params=params).raise_for_status()
    server.reap()
    assert api.get(f"/jobs/{job['id']}/logs").text == "kept a day\n"
    clock.advance(86400 + 3600)
    server.reap()
    assert api.get(f"/jobs/{job['id']}/logs").text == ""
    assert api.get(f"/jobs/{job['id']}").status_code == 200  # the job itself stays


def test_a_follow_ends_when_its_token_is_revoked_and_others_go_on(store_url, tmp_path, clock):
    """A follow outlives the request its token was checked for: it checks again when the token file
    changes, and ends once its token no longer stands for its caller (issue 24)."""
    token_file = tmp_path / "tokens"
    token_file.write_text("alice-token user alice\nbob-token user bob\n")
    store = open_store(store_url)
    with ServerThread(store, ServerSettings(auth_tokens=str(token_file)), clock) as server:
        alice = {"Authorization": "Bearer alice-token"}
        job = httpx.post(f"{server.url}/jobs", json={"command": "true"}, headers=alice).json()
        ended: dict[str, threading.Event] = {"alice": threading.Event(), "bob": threading.Event()}

        def follow(who: str) -> None:
            headers = {"Authorization": f"Bearer {who}-token"}
            path = f"/jobs/{job['id']}/logs"
            with (
                httpx.Client(base_url=server.url, timeout=15) as client,
                client.stream("GET", path, params={"follow": 1}, headers=headers) as response,
            ):
                assert response.status_code == 200
                for _ in response.iter_raw():
                    pass
            ended[who].set()

        readers = [threading.Thread(target=follow, args=(who,), daemon=True) for who in ended]
        for reader in readers:
            reader.start()
        wait_until(
            lambda: (
                server.state.log_watches.watches.get(job["id"], None) is not None
                and server.state.log_watches.watches[job["id"]].followers == 2
            )
        )
        token_file.write_text("alice-token user alice\n")
        assert ended["bob"].wait(10), "bob's follow went on after his token was revoked"
        assert not ended["alice"].is_set()
        cancel = httpx.post(f"{server.url}/jobs/{job['id']}/cancel", headers=alice)
        assert cancel.status_code == 200, cancel.text
        assert ended["alice"].wait(10), "alice's follow ends with her job"
        for reader in readers:
            reader.join(timeout=5)
    store.close()


def wait_until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
