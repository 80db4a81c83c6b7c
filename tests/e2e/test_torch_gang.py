"""The torch example as corral runs it: a real DDP/gloo gang of 2 on two real workers.

Rank 1 crashes after step 3; rank 0 dies on its own a moment later, its ``all_reduce`` having lost
its peer ("Connection reset by peer"), long before a heartbeat could tell it to stop. Both ends
of the attempt upload what the ranks wrote, so the second attempt of both ranks resumes from rank
0's step-3 checkpoint and the gang ends done, with the loss going on from where it was.

Needs PyTorch (a CPU build is enough), which is not in the dev install: skipped without it.
"""

from __future__ import annotations

import io
import itertools
import re
import sys
import warnings
from pathlib import Path

import pytest

from corral.client import Client
from tests.e2e.conftest import gang_cluster, submit_gang, wait_gang

with warnings.catch_warnings():
    # A CPU build of torch without NumPy warns about it at import (errors here, by the settings).
    warnings.simplefilter("ignore")
    torch = pytest.importorskip(
        "torch",
        reason="the torch example needs PyTorch, which the dev install leaves out: pip install torch",
        exc_type=ImportError,
    )

pytestmark = [pytest.mark.e2e, pytest.mark.torch]

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "torch_gang" / "train.py"
STEP_LINE = re.compile(r"rank (\d) attempt (\d) step (\d+) loss ([0-9.]+)")


@pytest.mark.timeout(240)
def test_a_torch_gang_whose_ranks_die_resumes_from_rank_0s_checkpoint(
    start_server, start_worker, tmp_path: Path
):
    server, _ = gang_cluster(start_server, start_worker)
    logs = tmp_path / "logs"
    logs.mkdir()
    command = f"exec {sys.executable} {TRAIN} --steps 6 > {logs}/rank-$RANK-attempt-$CORRAL_ATTEMPT.log 2>&1"
    # Every rank is on this host: gloo talks over loopback whatever the host name resolves to.
    env = {"TRAIN_CRASH_RANK1_AT_STEP": "3", "GLOO_SOCKET_IFNAME": "lo"}
    with Client(server.url) as client:
        rank0, _ = submit_gang(client, command, env=env, max_retries=3)
        gang = wait_gang(client, rank0, timeout_s=180)
        stored = client.download_checkpoint(rank0)

    output = {path.stem: path.read_text() for path in sorted(logs.iterdir())}
    for name, text in output.items():
        print(f"--- {name}")
        print("\n".join(line for line in text.splitlines() if line.startswith("rank ")))
    assert gang["status"] == "done", output
    assert sorted(output) == ["rank-0-attempt-1", "rank-0-attempt-2", "rank-1-attempt-1", "rank-1-attempt-2"]
    assert "crashing after step 3" in output["rank-1-attempt-1"]
    assert "Connection" in output["rank-0-attempt-1"]  # rank 0's collective lost its peer
    assert "resumed from step 3 (rank 0's checkpoint)" in output["rank-0-attempt-2"]
    assert "resumed from step 3 (rank 0's checkpoint)" in output["rank-1-attempt-2"]

    losses = {}
    for name, text in output.items():
        for rank, attempt, step, loss in STEP_LINE.findall(text):
            assert f"rank-{rank}-attempt-{attempt}" == name
            losses[(int(rank), int(attempt), int(step))] = float(loss)
    for rank in (0, 1):
        assert [step for (r, a, step) in losses if (r, a) == (rank, 1)] == [1, 2, 3]
        assert [step for (r, a, step) in losses if (r, a) == (rank, 2)] == [4, 5, 6]
    # The loss went on from where attempt 1 left it (a restart from scratch would repeat step 1's).
    rank0 = [losses[(0, 1 if step <= 3 else 2, step)] for step in range(1, 7)]
    assert all(later < earlier for earlier, later in itertools.pairwise(rank0)), rank0
    # The last attempt's done kept its final checkpoint too.
    assert stored is not None
    assert torch.load(io.BytesIO(stored), weights_only=True)["step"] == 6
