"""Topology-aware gang placement end to end (issue 25): a real server, six real workers labelled in
three racks of two, where the lowest worker ids sit in different racks (w1 r1, w2 r2, w3 r3, w4 r1,
w5 r2, w6 r3): an id-order placement would split every gang over racks.

A 2-rank gang that requires ``topology.rack`` lands inside one rack; a 4-rank gang (no rack holds
it) spans two racks with consecutive ``RANK``s in the same rack. Each rank writes its ``RANK`` to a
file named after its job id, so the test reads the rank order from the ranks themselves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import FAST_SERVER_FLAGS, wait_for, wait_gang

pytestmark = pytest.mark.e2e

RACK_OF = {f"w{index}": f"r{(index - 1) % 3 + 1}" for index in range(1, 7)}


WRITE_RANK = (
    "import os, sys; "
    "open(sys.argv[1] + '/rank-' + os.environ['CORRAL_JOB_ID'], 'w').write(os.environ['RANK'])"
)


def write_rank(directory: Path) -> str:
    return f'{sys.executable} -c "{WRITE_RANK}" {directory}'


def ranks_by_worker(client: Client, gang: dict, directory: Path) -> list[tuple[int, str]]:
    """(RANK the rank read, worker id) for each task, in RANK order."""
    found = []
    for task in gang["tasks"]:
        rank = int((directory / f"rank-{task['id']}").read_text())
        found.append((rank, task["worker_id"]))
    return sorted(found)


def test_gangs_stay_inside_racks_and_rank_order_follows_them(start_server, start_worker, tmp_path: Path):
    server = start_server(*FAST_SERVER_FLAGS)
    for worker_id, rack in RACK_OF.items():
        start_worker(
            server.url,
            worker_id,
            "--gpus", "1", "--vram-mb", "16000", "--gpu-model", "FakeGPU",
            "--label", "topology.block=b1", "--label", f"topology.rack={rack}",
        )  # fmt: skip
    with Client(server.url) as client:
        wait_for(
            lambda: len([w for w in client.workers() if w.status == "active"]) == 6 or None,
            20,
            "six workers to register",
        )
        pair = client.submit_body(
            {
                "command": write_rank(tmp_path),
                "gang_size": 2,
                "resources": {"gpus": 1},
                "topology": {"required": "topology.rack"},
            }
        )
        pair_gang = wait_gang(client, pair["tasks"][0], 30)
        four = client.submit_body({"command": write_rank(tmp_path), "gang_size": 4, "resources": {"gpus": 1}})
        four_gang = wait_gang(client, four["tasks"][0], 30)

    assert pair_gang["status"] == "done", pair_gang
    pair_ranks = ranks_by_worker(client, pair_gang, tmp_path)
    assert [rank for rank, _ in pair_ranks] == [0, 1]
    assert len({RACK_OF[worker] for _, worker in pair_ranks}) == 1, pair_ranks  # not w1 and w2

    assert four_gang["status"] == "done", four_gang
    four_ranks = ranks_by_worker(client, four_gang, tmp_path)
    racks = [RACK_OF[worker] for _, worker in four_ranks]
    assert len(set(racks)) == 2, four_ranks  # the fewest racks that hold four ranks
    assert racks[0] == racks[1] and racks[2] == racks[3], four_ranks  # consecutive ranks share one
