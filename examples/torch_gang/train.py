"""A tiny data-parallel training run for a corral gang: PyTorch DDP over gloo, on CPUs, resumable.

corral starts one copy per rank with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
set, which is all ``torch.distributed.init_process_group("gloo")`` needs: nothing here knows
about corral but the checkpoint files, read and written through ``corral.jobkit``::

    corral submit --gang-size 2 --max-retries 3 -- python examples/torch_gang/train.py

After every step rank 0 saves ``{"step", "model"}`` (``torch.save`` into bytes) as its checkpoint.
The worker uploads it however the attempt ends, so when a rank crashes and its peer dies a moment
later in a collective that lost it, the next attempt of every rank loads rank 0's checkpoint from
``$CORRAL_GANG_CHECKPOINT_DIR/rank-0`` (else its own, ``$CORRAL_CHECKPOINT_IN``) and goes on from
that step. The data set is fixed and plain SGD keeps no optimiser state, so a resumed run takes
exactly the steps an uninterrupted one would have.

``TRAIN_CRASH_RANK1_AT_STEP=N`` makes rank 1 crash (``os._exit(3)``) right after step N unless
the run resumed from a checkpoint: the first attempt crashes, a resumed one goes past it. Each
step prints ``rank R attempt A step S loss L`` (L: the loss over every rank's data).
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import sys
import warnings
from typing import Any

from corral import jobkit


def load_state(torch: Any) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint to resume from, and where it came from: rank 0's (the model every rank
    shares), else this rank's own; (None, "") on a first run."""
    for data, source in ((jobkit.load_gang_checkpoint(0), "rank 0's"), (jobkit.load_checkpoint(), "its own")):
        if data:
            state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
            return state, source
    return None, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="training steps in all")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (plain SGD)")
    arguments = parser.parse_args(argv)
    crash_at = int(os.environ.get("TRAIN_CRASH_RANK1_AT_STEP") or 0)
    # A CPU build of torch without NumPy warns about it at import; nothing here uses NumPy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        print("this example needs PyTorch: pip install torch", file=sys.stderr)
        return 2

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("CORRAL_ATTEMPT", "-")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    state, source = load_state(torch)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        start = int(state["step"])
        print(f"rank {rank} attempt {attempt} resumed from step {start} ({source} checkpoint)", flush=True)
    else:
        print(f"rank {rank} attempt {attempt} starting from step 0", flush=True)
    trained = DistributedDataParallel(model)
    optimiser = torch.optim.SGD(trained.parameters(), lr=arguments.lr)
    # This rank's shard of a fixed data set: the same on every attempt.
    generator = torch.Generator().manual_seed(1000 + rank)
    inputs = torch.randn(64, 8, generator=generator)
    targets = inputs @ torch.arange(1.0, 9.0).unsqueeze(1)

    for step in range(start + 1, arguments.steps + 1):
        loss = torch.nn.functional.mse_loss(trained(inputs), targets)
        optimiser.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here (an all_reduce)
        optimiser.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean = mean_loss.item() / world_size
        print(f"rank {rank} attempt {attempt} step {step} loss {mean:.6f}", flush=True)
        jobkit.beat(step)
        if rank == 0:
            buffer = io.BytesIO()
            torch.save({"step": step, "model": model.state_dict()}, buffer)
            jobkit.save_checkpoint(buffer.getvalue())
        if rank == 1 and step == crash_at and state is None:
            print(f"rank 1 attempt {attempt} crashing after step {step}", flush=True)
            os._exit(3)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
