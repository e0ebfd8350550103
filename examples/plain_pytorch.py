"""A plain PyTorch loop with step telemetry for tuimon (CPU or GPU).

    python -m examples.plain_pytorch --job demo --steps 50

Each step is timed (CUDA events on a GPU, the wall clock otherwise), with the input
pipeline as `data`, the gradient all-reduce as `comm` and the checkpoint as
`checkpoint`; the agent on the node (`tuimon-agent`) sums them for the relay and the app.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist

from agent.reporter import StepReporter
from agent.reporter_torch import TorchStepTimer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="plain-pytorch")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--socket", default=None, help="the agent's step socket")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reporter = StepReporter(args.job, rank, world, socket_path=args.socket)
    timer = TorchStepTimer(reporter)
    with tempfile.TemporaryDirectory() as out:
        for step in range(args.steps):
            with timer.step(samples=args.batch):
                with timer.waiting("data"):
                    x = torch.randn(args.batch, 64).to(device)
                    y = x.sum(dim=1, keepdim=True)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                with timer.waiting("comm"):
                    if dist.is_available() and dist.is_initialized():
                        for param in model.parameters():
                            dist.all_reduce(param.grad)
                optimizer.step()
                if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                    with timer.waiting("checkpoint"):
                        torch.save(model.state_dict(), os.path.join(out, "model.pt"))
            timer.flush()
    timer.finish()
    reporter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
