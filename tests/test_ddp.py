"""The training loop under torchrun: 2 CPU processes (gloo) end with identical weights, equal
to one process with the same global batch; only rank 0 writes checkpoints and reports; a
resumed distributed run equals the uninterrupted one."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bertlab.training.checkpoint import list_checkpoints, read_state
from bertlab.training.loop import train

WORKER = Path(__file__).with_name("ddp_worker.py")

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _worker_module():
    spec = importlib.util.spec_from_file_location("ddp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun(out: Path, nproc: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER), str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both workers
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in 240 s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    _torchrun(out, 2)
    return out


def test_both_ranks_end_with_the_same_weights_as_one_process(ddp_run: Path):
    w = _worker_module()
    r0, r1 = (torch.load(ddp_run / f"rank{r}.pt", weights_only=True) for r in range(2))
    assert r0["status"] == r1["status"] == "completed"
    for k in r0["state"]:
        assert torch.equal(r0["state"][k], r1["state"][k]), k

    torch.set_num_threads(1)
    single = w.make_model()
    start = {k: v.clone() for k, v in single.state_dict().items()}
    res = train(single, w.loss_fn, w.make_data(), w.config(w.PER_RANK_BATCH * w.WORLD_SIZE, None))
    assert res.step == 8
    for k, v in single.state_dict().items():
        torch.testing.assert_close(r0["state"][k], v, atol=1e-5, rtol=1e-4, msg=k)
        assert not torch.equal(v, start[k]), f"{k} did not train"
    # The logged loss is the mean over both processes: the single process's loss.
    losses = [h["loss"] for h in r0["history"] if h["kind"] == "train"]
    assert losses == pytest.approx([h["loss"] for h in res.history if h["kind"] == "train"], rel=1e-4)


def test_only_rank_0_writes_checkpoints_and_reports(ddp_run: Path):
    r0, r1 = (torch.load(ddp_run / f"rank{r}.pt", weights_only=True) for r in range(2))
    assert r0["events"] > 0 and r1["events"] == 0
    assert [p.name for p in list_checkpoints(ddp_run / "run")] == ["checkpoint-4", "checkpoint-8"]
    assert sorted(p.name for p in (ddp_run / "run").iterdir()) == ["checkpoint-4", "checkpoint-8"]
    state = read_state(ddp_run / "run" / "checkpoint-8")
    assert state.world_size == 2 and len(state.rng) == 2


def test_a_resumed_distributed_run_equals_the_uninterrupted_one(ddp_run: Path):
    full = torch.load(ddp_run / "rank0.pt", weights_only=True)
    for r in range(2):
        resumed = torch.load(ddp_run / f"rank{r}-resumed.pt", weights_only=True)
        for k in full["state"]:
            assert torch.equal(resumed["state"][k], full["state"][k]), (r, k)
    assert [p.name for p in list_checkpoints(ddp_run / "resumed")] == ["checkpoint-8"]
