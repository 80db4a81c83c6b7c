from corral.client import Client


def test_submit_claim_done(server):
    with Client(server.url) as client:
        job = client.submit({"command": "echo hi"})
        client.register_worker({"id": "w1", "resources": {"cpus": 2}})
        claimed = client.claim("w1")
        assert claimed["id"] == job["id"]
        done = client.done(job["id"], "w1", claimed["attempt"])
        assert done["status"] == "done"
