"""An example corral job: a small PyTorch training loop that beats once per step.

Run it under corral (``python -m`` so that ``import torch`` finds PyTorch, not this file)::

    corral submit --gpus 1 -- python -m corral.jobkit.torch --steps 2000

Every step calls ``corral.jobkit.beat(step)``; beat writes the beat file at most once a second, so
calling it per step costs nothing measurable. The first beat comes after the model and the data are
on the device: the stall watchdog stays inert while they load and polices only the training loop.
Outside corral the beats are no-ops and the script just trains. PyTorch is imported inside
``main`` only, so importing ``corral.jobkit`` never needs it.
"""

from __future__ import annotations

import argparse
import sys

from corral import jobkit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral.jobkit.torch", description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="training steps")
    parser.add_argument("--batch", type=int, default=256, help="batch size")
    parser.add_argument("--width", type=int, default=512, help="hidden width of the model")
    arguments = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("this example needs PyTorch: pip install torch", file=sys.stderr)
        return 2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, arguments.width), torch.nn.ReLU(), torch.nn.Linear(arguments.width, 1)
    ).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randn(64, 1, device=device)
    jobkit.beat(0)  # loaded: from here on, a silence is a suspected stall
    loss = torch.tensor(0.0)
    for step in range(1, arguments.steps + 1):
        inputs = torch.randn(arguments.batch, 64, device=device)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs @ target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        jobkit.beat(step)
    print(f"device {device}: {arguments.steps} steps, final loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
