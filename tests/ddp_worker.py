"""Launched by tests/test_ddp.py under `torchrun --nproc_per_node=2` (gloo on CPU).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_worker.py OUT

Trains the tiny task below with `bertlab.training.loop.train` (which joins the process group
itself), then trains again resumed from the first run's step-4 checkpoint, and writes
OUT/rank<r>.pt and OUT/rank<r>-resumed.pt: final weights, status, number of callback events.
The test imports the same helpers to run the single-process reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.training.loop import TrainConfig, train

PER_RANK_BATCH = 2
WORLD_SIZE = 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))


def make_data(n: int = 48) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(-1)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def loss_fn(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = model(batch["x"])  # [batch, 3]
    return F.cross_entropy(logits, batch["y"]), {}


def config(batch_size: int, out_dir: str | None) -> TrainConfig:
    # 48 examples / (4 a micro-batch) / 2 accumulation = 6 steps an epoch; 8 steps cross an epoch.
    return TrainConfig(lr=1e-2, batch_size=batch_size, grad_accum_steps=2, max_steps=8, warmup_steps=2,
                       log_every=2, checkpoint_every=4, keep_last=None, out_dir=out_dir, seed=0,
                       ddp_find_unused_parameters=False, precision="fp32")  # exact sums: compared to one process


def run(out: Path, rank: int, resume: Path | None) -> None:
    events = []
    model = make_model()
    ckpt_dir = out / ("resumed" if resume else "run")
    result = train(model, loss_fn, make_data(), config(PER_RANK_BATCH, str(ckpt_dir)),
                   callbacks=[events.append], resume_from=resume)
    result.raise_for_status()
    name = f"rank{rank}{'-resumed' if resume else ''}.pt"
    torch.save({"state": model.state_dict(), "status": result.status, "events": len(events),
                "history": result.history}, out / name)


def main(out: Path) -> None:
    """A full run, then (joining a fresh process group) a run resumed from its step-4 checkpoint."""
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    run(out, rank, None)
    run(out, rank, out / "run" / "checkpoint-4")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
