"""The shared training loop: optimisation, schedule, accumulation, clipping, determinism,
checkpoints (atomic, resumable), cancellation, errors. Tiny models on CPU, no timing."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bertlab.training import checkpoint as ckpt
from bertlab.training.checkpoint import (
    DiskFullError,
    TrainingStateError,
    latest_checkpoint,
    list_checkpoints,
    load_model_weights,
    read_state,
)
from bertlab.training.loop import (
    DataPlan,
    TqdmCallback,
    TrainConfig,
    TrainEvent,
    TrainingError,
    clip_and_step,
    lr_factor,
    make_optimizer,
    move_to_device,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


# -- a tiny task -----------------------------------------------------------------------------
class Tiny(nn.Module):
    """8 features -> 3 classes, with LayerNorm (no decay) and dropout (RNG on resume)."""

    def __init__(self, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(dropout), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, 8] -> [batch, 3]
        return self.net(x)


def make_data(n: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(-1)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def ce_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = model(batch["x"])
    return F.cross_entropy(logits, batch["y"]), {"accuracy": (logits.argmax(-1) == batch["y"]).float().mean()}


def noisy_collate(examples: list[dict], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random augmentation drawn from the loop's generator (as MLM masking would be)."""
    x = torch.stack([e["x"] for e in examples])
    return {"x": x + 0.1 * torch.randn(x.shape, generator=generator), "y": torch.stack([e["y"] for e in examples])}


def cfg(**kw) -> TrainConfig:
    base = dict(lr=1e-2, batch_size=8, max_steps=6, log_every=1, seed=0, warmup_steps=0, weight_decay=0.01)
    base.update(kw)
    return TrainConfig(**base)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if atol:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k


# -- optimisation ----------------------------------------------------------------------------
def test_loss_goes_down_and_events_stream():
    events: list[TrainEvent] = []
    model = Tiny()
    res = train(model, ce_loss, make_data(128), cfg(max_steps=60, log_every=10, lr=3e-2), callbacks=[events.append])
    assert res.status == "completed" and res.step == 60 and res.ok
    losses = [h["loss"] for h in res.history if h["kind"] == "train"]
    assert len(losses) == 6
    assert losses[-1] < 0.5 * losses[0]
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("step") == 6
    step = [e for e in events if e.kind == "step"][-1]
    assert step.step == 60 and step.total_steps == 60 and 0 <= step.metrics["accuracy"] <= 1
    assert step.examples_per_s > 0 and step.tokens_per_s is None  # no input_ids in this task
    assert model.training  # mode restored


def test_epochs_count_steps_and_skip_the_remainder():
    # 70 examples, batch 8, accumulation 2 -> 8 micro-batches -> 4 steps an epoch (6 left over)
    res = train(Tiny(), ce_loss, make_data(70), cfg(max_steps=None, epochs=3, grad_accum_steps=2))
    assert res.total_steps == 12 and res.step == 12
    assert [h["epoch"] for h in res.history if h["kind"] == "train"][3] == 1.0


@contextlib.contextmanager
def optimizer_steps():
    """Record, before every optimizer step, the global norm of the gradient it will use and its lr."""
    seen: list[tuple[float, float]] = []

    def record(opt, args, kwargs):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        seen.append((float(norm), opt.param_groups[0]["lr"]))

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


def test_clipping_bounds_the_gradient_the_optimizer_sees():
    def big_loss(model, batch):
        loss, m = ce_loss(model, batch)
        return 1000 * loss, m

    with optimizer_steps() as clipped:
        res = train(Tiny(), big_loss, make_data(), cfg(max_grad_norm=0.5, max_steps=3))
    with optimizer_steps() as unclipped:
        train(Tiny(), big_loss, make_data(), cfg(max_grad_norm=None, max_steps=1))
    assert len(clipped) == 3 and all(n <= 0.5 * (1 + 1e-4) for n, _ in clipped)
    reported = [h["grad_norm"] for h in res.history if h["kind"] == "train"]
    assert all(n > 0.5 for n in reported)  # the norm before clipping is what is reported
    assert unclipped[0][0] > 0.5 and reported[0] == pytest.approx(unclipped[0][0], rel=1e-4)


@pytest.mark.parametrize("max_norm", [0.05, 1e6, None, 0.0])
def test_clip_and_step_is_clip_grad_norm_then_step(max_norm):
    """The loop's fused AdamW: the same norm, weights and (clipped) gradients as `clip_grad_norm_` then `step()`;
    no clipping for none or 0, as the loop's `max_grad_norm`."""
    data = make_data(32)
    models = [Tiny(seed=1), Tiny(seed=1)]
    opts = [make_optimizer(m, cfg(lr=1e-2, weight_decay=0.01), torch.device("cpu")) for m in models]
    assert opts[1].defaults["fused"]
    for step in range(4):
        for m in models:
            m.zero_grad(set_to_none=True)
            ce_loss(m, {"x": torch.stack([d["x"] for d in data]) * (1 + 30 * step),
                        "y": torch.stack([d["y"] for d in data])})[0].backward()
        params = [list(m.parameters()) for m in models]
        expected = torch.nn.utils.clip_grad_norm_(params[0], max_norm or float("inf"))
        opts[0].step()
        assert float(clip_and_step(opts[1], params[1], max_norm)) == pytest.approx(float(expected), rel=1e-6)
        for a, b in zip(*params):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7)  # what the step used, as clipped
    if max_norm == 0.05:
        assert float(expected) > 0.05  # the clip did act


def test_clip_and_step_falls_back_to_clip_grad_norm_for_other_optimizers():
    model = Tiny()
    ce_loss(model, {"x": torch.randn(4, 8) * 100, "y": torch.tensor([0, 1, 2, 0])})[0].backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append(float(torch.nn.utils.get_total_norm(
        [p.grad for p in model.parameters()]))))
    assert float(clip_and_step(opt, list(model.parameters()), 0.5)) > 0.5
    assert seen == [pytest.approx(0.5, rel=1e-4)]  # the gradients were clipped before the step


def test_no_weight_decay_on_biases_and_layernorm():
    model = Tiny()
    opt = make_optimizer(model, cfg(weight_decay=0.1), torch.device("cpu"))
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    net = model.net
    assert by_decay[0.1] == {id(net[0].weight), id(net[4].weight)}
    assert by_decay[0.0] == {id(net[0].bias), id(net[1].weight), id(net[1].bias), id(net[4].bias)}


def test_grad_accumulation_equals_one_big_batch():
    big, small = Tiny(), Tiny()
    data = make_data(64)
    exact = dict(max_steps=5, max_grad_norm=None, precision="fp32")  # bf16 rounds each micro-batch apart
    with optimizer_steps() as big_steps:
        train(big, ce_loss, data, cfg(batch_size=8, grad_accum_steps=1, **exact))
    with optimizer_steps() as small_steps:
        train(small, ce_loss, data, cfg(batch_size=2, grad_accum_steps=4, **exact))
    assert len(big_steps) == len(small_steps) == 5  # one optimizer step per 4 micro-batches
    assert [n for n, _ in small_steps] == pytest.approx([n for n, _ in big_steps], rel=1e-5)
    assert_same(weights(big), weights(small), atol=1e-6)
    assert not all(torch.equal(a, b) for a, b in zip(weights(big).values(), weights(Tiny()).values()))


# -- schedule --------------------------------------------------------------------------------
def test_lr_factor_warmup_then_decay():
    linear = [lr_factor(s, total_steps=10, warmup_steps=2) for s in range(10)]
    assert linear == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])
    assert lr_factor(10, 10, 2) == 0.0
    cosine = [lr_factor(s, 10, 2, "cosine") for s in (0, 1, 2, 6, 10)]
    assert cosine == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
    assert lr_factor(7, 10, 2, "constant") == 1.0
    assert lr_factor(0, 10, 0) == 1.0


def test_optimizer_uses_the_scheduled_lr_each_step():
    with optimizer_steps() as steps:
        res = train(Tiny(), ce_loss, make_data(), cfg(lr=0.1, max_steps=8, warmup_ratio=0.25, schedule="linear"))
    expected = [0.1 * lr_factor(s, 8, 2) for s in range(8)]
    assert [lr for _, lr in steps] == pytest.approx(expected)
    assert [h["lr"] for h in res.history if h["kind"] == "train"] == pytest.approx(expected)


# -- determinism and data order --------------------------------------------------------------
def test_same_seed_same_run_other_seed_other_run():
    runs = []
    for seed in (3, 3, 4):
        model = Tiny(dropout=0.2)
        res = train(model, ce_loss, make_data(), cfg(seed=seed), collate=noisy_collate)
        runs.append((weights(model), [h["loss"] for h in res.history]))
    assert_same(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    assert runs[0][1] != runs[2][1]


def test_data_plan_shards_by_rank_and_reshuffles_each_epoch():
    plan = DataPlan(20, batch_size=2, world_size=2, grad_accum_steps=2, seed=0, shuffle=True)
    assert plan.steps_per_epoch == 2  # 10 batches / 2 ranks / 2 accum (2 batches left over)
    step0 = [plan.indices(0, 0, m, r) for m in range(2) for r in range(2)]
    assert len({i for b in step0 for i in b}) == 8  # ranks never share examples
    single = DataPlan(20, batch_size=4, world_size=1, grad_accum_steps=2, seed=0, shuffle=True)
    for m in range(2):  # rank slices of a micro-batch == the single process's micro-batch
        assert sorted(plan.indices(0, 0, m, 0) + plan.indices(0, 0, m, 1)) == sorted(single.indices(0, 0, m, 0))
    assert plan.epoch_batches(0) != plan.epoch_batches(1)
    draws = {float(torch.rand(1, generator=plan.collate_generator(e, s, m, r)))
             for e in range(2) for s in range(2) for m in range(2) for r in range(2)}
    assert len(draws) == 16  # every micro-batch of every process masks with its own stream
    ordered = DataPlan(5, 2, 1, 1, seed=0, shuffle=False)
    assert ordered.epoch_batches(0) == [[0, 1], [2, 3]] == ordered.epoch_batches(7)


def test_batch_sampler_replaces_the_default_order():
    class Sampler:
        def __init__(self):
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self):
            return iter([[0, 1, 2], [3, 4], [5, 6, 7, 8]])

    seen: list[int] = []

    def loss(model, batch):
        seen.append(len(batch["y"]))
        return ce_loss(model, batch)

    sampler = Sampler()
    res = train(Tiny(), loss, make_data(9), cfg(max_steps=None, epochs=2), batch_sampler=sampler)
    assert res.step == 6 and seen == [3, 2, 4, 3, 2, 4] and sampler.epochs == [0, 1]


def test_move_to_device_keeps_structure():
    from bertlab.tokenizer import Batch

    b = Batch(torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), [])
    out = move_to_device({"batch": b, "pair": (torch.ones(1), 3)}, torch.device("cpu"))
    assert isinstance(out["batch"], Batch) and out["pair"][1] == 3 and out["batch"].input_ids.shape == (2, 3)


# -- checkpoints and resume ------------------------------------------------------------------
def test_checkpoints_keep_last_and_hold_resume_state(tmp_path: Path):
    out = tmp_path / "run"
    model = Tiny()
    res = train(model, ce_loss, make_data(), cfg(max_steps=7, checkpoint_every=2, keep_last=2, out_dir=str(out)))
    names = [p.name for p in list_checkpoints(out)]
    assert names == ["checkpoint-6", "checkpoint-7"]  # 2, 4 pruned; the final step saved too
    assert res.last_checkpoint == out / "checkpoint-7" == latest_checkpoint(out)
    files = {p.name for p in (out / "checkpoint-7").iterdir()}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= files
    state = read_state(out / "checkpoint-7")
    assert state.step == 7 and state.status == "completed" and len(state.rng) == 1
    assert state.config["checkpoint_every"] == 2 and state.history == res.history
    fresh = Tiny(seed=9)
    load_model_weights(fresh, out / "checkpoint-7")
    assert_same(weights(fresh), weights(model))
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_resume_equals_uninterrupted_run(tmp_path: Path):
    data = make_data(40)  # 5 steps an epoch: the run crosses epochs
    c = dict(max_steps=12, grad_accum_steps=2, batch_size=4, dropout_free=False)
    c.pop("dropout_free")

    full = Tiny(dropout=0.2)
    ref = train(full, ce_loss, data, cfg(**c, checkpoint_every=4, out_dir=str(tmp_path / "a")), collate=noisy_collate)

    # The same run, cancelled after step 7 from a callback.
    cancel = threading.Event()

    def stop_at_7(e: TrainEvent) -> None:
        if e.kind == "step" and e.step == 7:
            cancel.set()

    part = Tiny(dropout=0.2)
    res = train(part, ce_loss, data, cfg(**c, out_dir=str(tmp_path / "b")), collate=noisy_collate,
                callbacks=[stop_at_7], cancel=cancel)
    assert res.status == "cancelled" and res.step == 7
    assert read_state(tmp_path / "b" / "checkpoint-7").status == "cancelled"

    # Resume into a differently initialised model: weights, optimizer, schedule, RNG, data position.
    resumed = Tiny(dropout=0.2, seed=5)
    res2 = train(resumed, ce_loss, data, cfg(**c, out_dir=str(tmp_path / "b")), collate=noisy_collate,
                 resume_from=tmp_path / "b" / "checkpoint-7")
    assert res2.status == "completed" and res2.step == 12
    assert_same(weights(resumed), weights(full))
    assert [h["loss"] for h in res2.history] == [h["loss"] for h in ref.history]

    # And from a periodic checkpoint of the uninterrupted run, without writing anything.
    again = Tiny(dropout=0.2, seed=6)
    train(again, ce_loss, data, cfg(**c), collate=noisy_collate, resume_from=tmp_path / "a" / "checkpoint-8")
    assert_same(weights(again), weights(full))


def test_resume_from_an_earlier_checkpoint_drops_the_later_ones(tmp_path: Path):
    out = tmp_path / "run"
    train(Tiny(), ce_loss, make_data(), cfg(max_steps=6, checkpoint_every=2, keep_last=None, out_dir=str(out)))
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    res = train(Tiny(), ce_loss, make_data(), cfg(max_steps=6, checkpoint_every=0, keep_last=None, out_dir=str(out)),
                resume_from=out / "checkpoint-2")
    assert res.step == 6 and [p.name for p in list_checkpoints(out)] == ["checkpoint-2", "checkpoint-6"]
    assert read_state(out / "checkpoint-6").history[-1]["step"] == 6


def test_out_dir_with_checkpoints_needs_resume_or_overwrite(tmp_path: Path):
    out = str(tmp_path / "run")
    train(Tiny(), ce_loss, make_data(), cfg(max_steps=2, out_dir=out))
    with pytest.raises(ValueError, match="resume_from=latest_checkpoint"):
        train(Tiny(), ce_loss, make_data(), cfg(max_steps=2, out_dir=out))
    other = tmp_path / "other"
    train(Tiny(), ce_loss, make_data(), cfg(max_steps=1, out_dir=str(other)))
    with pytest.raises(ValueError, match="already holds checkpoints"):  # never prunes a foreign run
        train(Tiny(), ce_loss, make_data(), cfg(max_steps=2, out_dir=out), resume_from=other / "checkpoint-1")
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2"]
    res = train(Tiny(), ce_loss, make_data(), cfg(max_steps=1, out_dir=out, overwrite=True))
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1"] and res.ok


def test_resume_rejects_a_checkpoint_of_another_model(tmp_path: Path):
    out = tmp_path / "run"
    train(Tiny(), ce_loss, make_data(), cfg(max_steps=2, out_dir=str(out)))

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 3)

        def forward(self, x):
            return self.lin(x)

    with pytest.raises(TrainingStateError, match="same model"):
        train(Other(), ce_loss, make_data(), cfg(max_steps=4), resume_from=out / "checkpoint-2")
    with pytest.raises(TrainingStateError, match="not a training checkpoint"):
        train(Tiny(), ce_loss, make_data(), cfg(max_steps=4), resume_from=tmp_path)


# -- atomic writes ---------------------------------------------------------------------------
def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch):
    out = tmp_path / "run"
    real = ckpt.save_model_files
    calls = []

    def dies_on_second_write(model, tok, folder):
        calls.append(folder)
        real(model, tok, folder)
        if len(calls) == 2:
            (folder / "model.safetensors").write_bytes(b"half a file")
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_model_files", dies_on_second_write)
    model = Tiny()
    res = train(model, ce_loss, make_data(), cfg(max_steps=6, checkpoint_every=2, out_dir=str(out)))
    assert res.status == "failed" and res.error.startswith(f"the disk is full while writing {out / 'checkpoint-4'}")
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2"] and res.last_checkpoint == out / "checkpoint-2"
    assert [p.name for p in out.iterdir()] == ["checkpoint-2"]  # the temp folder is cleaned up
    monkeypatch.setattr(ckpt, "save_model_files", real)
    resumed = Tiny(seed=3)
    assert train(resumed, ce_loss, make_data(), cfg(max_steps=6, out_dir=str(out)), resume_from=out / "checkpoint-2").ok


DISK_FULL = {
    "os": OSError(errno.ENOSPC, "No space left on device"),
    "torch": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1108"),
    "torch-write": RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                                "data/0: file write failed"),
    "safetensors": Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                             '"No space left on device" })'),
}


@pytest.mark.parametrize("kind", list(DISK_FULL))
def test_a_full_disk_is_named_as_one_line(tmp_path: Path, monkeypatch, kind):
    """Whatever the writer says (the OS, torch.save's zip writer, safetensors), the run ends with
    "the disk is full while writing <folder>", and the previous checkpoint stays."""
    out = tmp_path / "run"
    real = torch.save

    def full_on_second_checkpoint(obj, f, *a, **k):
        if "checkpoint-4" in str(f):
            raise DISK_FULL[kind]
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_on_second_checkpoint)
    res = train(Tiny(), ce_loss, make_data(), cfg(max_steps=6, checkpoint_every=2, out_dir=str(out)))
    assert res.status == "failed" and isinstance(res.exception, DiskFullError)
    assert res.error == (f"the disk is full while writing {out / 'checkpoint-4'}: free some space (or write to a "
                         f"folder on another disk, e.g. --out elsewhere) and run again.")
    assert "\n" not in res.error and [p.name for p in out.iterdir()] == ["checkpoint-2"]
    assert ckpt.is_disk_full(DISK_FULL[kind]) and not ckpt.is_disk_full(RuntimeError("unexpected pos"))
    assert not ckpt.is_disk_full(OSError(errno.EACCES, "Permission denied"))


def test_a_model_is_saved_atomically_beside_what_the_folder_holds(tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    first, second = Tiny(seed=1), Tiny(seed=2)
    assert ckpt.save_model_atomically(first, None, out) == out
    assert (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").read_text() == "{}"  # carried over
    assert (out / "notes.txt").read_text() == "mine"
    fresh = Tiny(seed=3)
    load_model_weights(fresh, out)
    assert_same(weights(fresh), weights(first))
    # A failure half-way through the next save: the folder still holds the first model, whole.
    real = ckpt._st_save_model

    def half_then_full(model, filename, *a, **k):
        Path(filename).write_bytes(b"half a file")
        raise DISK_FULL["os"]

    monkeypatch.setattr(ckpt, "_st_save_model", half_then_full)
    with pytest.raises(DiskFullError, match=f"^the disk is full while writing {out}: "):
        ckpt.save_model_atomically(second, None, out)
    load_model_weights(fresh, out)
    assert_same(weights(fresh), weights(first))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left
    monkeypatch.setattr(ckpt, "_st_save_model", real)
    ckpt.save_model_atomically(second, None, out)
    load_model_weights(fresh, out)
    assert_same(weights(fresh), weights(second))
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "model.safetensors", "notes.txt"]


KILLED_MID_SAVE = """
import os, signal, sys, torch
from pathlib import Path
from bertlab.training import checkpoint as ckpt
out, where = Path(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
ckpt.save_model_atomically(model, None, out)  # the previous, complete model
with torch.no_grad():
    model.weight.add_(1.0)
kill = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if where == "writing":  # half a weights file written, then the process dies
    def half(m, filename, *a, **k):
        Path(filename).write_bytes(b"half a file")
        kill()
    ckpt._st_save_model = half
else:  # between moving the old folder aside and renaming the new one into place
    real_rename = os.rename
    def rename(a, b):
        real_rename(a, b)
        if ".trash-" in str(b):
            kill()
    ckpt.os.rename = rename
ckpt.save_model_atomically(model, None, out)
"""


@pytest.mark.parametrize("where", ["writing", "swapping"])
def test_a_kill_during_a_final_save_never_leaves_a_folder_that_half_loads(tmp_path: Path, where):
    out = tmp_path / "model"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(out), where], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -9, proc.stderr
    torch.manual_seed(0)
    previous = torch.nn.Linear(4, 3)
    fresh = torch.nn.Linear(4, 3)
    if where == "writing":  # OUT is the previous model, whole; the temp folder is hidden beside it
        load_model_weights(fresh, out)
        assert_same(weights(fresh), weights(previous))
    else:  # OUT is absent; the previous model sits beside it, whole, and is kept by the next save
        assert not out.exists()
        (trash,) = [p for p in tmp_path.iterdir() if p.name.startswith(".trash-model-")]
        load_model_weights(fresh, trash)
        assert_same(weights(fresh), weights(previous))
    ckpt.save_model_atomically(previous, None, out)  # the next save cleans the temp folders up
    leftovers = sorted(p.name[:7] for p in tmp_path.iterdir() if p.name != "model")
    assert leftovers == ([] if where == "writing" else [".trash-"])


def test_crash_mid_write_never_looks_like_a_checkpoint(tmp_path: Path, monkeypatch):
    """A process killed mid-write leaves only a hidden temp folder; the next save removes it."""
    out = tmp_path / "run"
    model = Tiny()
    train(model, ce_loss, make_data(), cfg(max_steps=2, out_dir=str(out)))
    good = weights(model)
    state = read_state(out / "checkpoint-2")
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    class Killed(BaseException):  # like SIGKILL: no cleanup code runs
        pass

    def killed(*a, **k):
        raise Killed

    monkeypatch.setattr(ckpt, "_remove_tree", lambda p: None)  # the crash skips cleanup
    monkeypatch.setattr(ckpt, "_fsync_tree", killed)
    with torch.no_grad():
        model.net[0].weight.add_(1.0)
    state.step = 3
    with pytest.raises(Killed):
        ckpt.save_checkpoint(out, model, None, opt, sched, state)
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and (out / leftovers[0] / "trainer_state.json").exists()
    assert latest_checkpoint(out) == out / "checkpoint-2"
    fresh = Tiny(seed=4)
    load_model_weights(fresh, latest_checkpoint(out))
    assert_same(weights(fresh), good)

    monkeypatch.undo()
    ckpt.save_checkpoint(out, model, None, opt, sched, state, keep_last=1)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-3"]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path):
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = ckpt.TrainerState(step=5, epoch=0, total_steps=9, num_examples=10)
    ckpt.save_checkpoint(tmp_path, model, None, opt, sched, state)
    state.history = [{"kind": "train", "step": 5, "loss": 1.0}]
    ckpt.save_checkpoint(tmp_path, model, None, opt, sched, state)
    assert read_state(tmp_path / "checkpoint-5").history == state.history
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-5"]


# -- cancel and errors -----------------------------------------------------------------------
def test_cancel_from_another_thread_keeps_a_loadable_checkpoint(tmp_path: Path):
    out = tmp_path / "run"
    cancel, reached, proceed = threading.Event(), threading.Event(), threading.Event()

    def pause_at_3(e: TrainEvent) -> None:
        if e.kind == "step" and e.step == 3:
            reached.set()
            assert proceed.wait(60)

    model = Tiny()
    box: dict = {}
    worker = threading.Thread(
        target=lambda: box.update(res=train(model, ce_loss, make_data(), cfg(max_steps=50, out_dir=str(out)),
                                            callbacks=[pause_at_3], cancel=cancel))
    )
    worker.start()
    assert reached.wait(60)
    cancel.set()
    proceed.set()
    worker.join(60)
    assert not worker.is_alive()
    res = box["res"]
    assert res.status == "cancelled" and res.step == 3 and res.error is None
    assert res.last_checkpoint == out / "checkpoint-3"
    fresh = Tiny(seed=1)
    load_model_weights(fresh, res.last_checkpoint)
    assert_same(weights(fresh), weights(model))


def test_an_error_in_a_step_is_reported_and_the_checkpoint_stays(tmp_path: Path, caplog):
    out = tmp_path / "run"
    events: list[TrainEvent] = []
    calls = {"n": 0}

    def breaks_at_step_4(model, batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise ValueError("label 7 is outside 0..2")
        return ce_loss(model, batch)

    with caplog.at_level(logging.ERROR, logger="bertlab.training.loop"):
        res = train(Tiny(), breaks_at_step_4, make_data(), cfg(max_steps=6, checkpoint_every=2, out_dir=str(out)),
                    callbacks=[events.append])
    assert res.status == "failed" and not res.ok and res.step == 3
    assert "ValueError at step 4: label 7 is outside 0..2" == res.error
    assert isinstance(res.exception, ValueError)
    with pytest.raises(TrainingError, match="label 7") as info:
        res.raise_for_status()
    assert isinstance(info.value.__cause__, ValueError)
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2"] and res.last_checkpoint == out / "checkpoint-2"
    assert [e.kind for e in events][-2:] == ["error", "end"] and events[-1].message == res.error
    assert any("label 7" in r.getMessage() for r in caplog.records)


def test_out_of_memory_says_what_to_change():
    def oom(model, batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    data = [{"input_ids": torch.ones(16, dtype=torch.long), "x": torch.zeros(8)} for _ in range(8)]
    res = train(Tiny(), oom, data, cfg(batch_size=4, max_steps=2))
    assert res.status == "failed" and isinstance(res.exception, torch.cuda.OutOfMemoryError)
    assert "Out of GPU memory with batches of 4 × up to 16 tokens at step 1" in res.error
    assert "smaller batch" in res.error and "shorter sequences" in res.error


def test_diverging_loss_stops_with_advice():
    def nan_loss(model, batch):
        loss, m = ce_loss(model, batch)
        return loss * float("nan"), m

    res = train(Tiny(), nan_loss, make_data(), cfg(max_steps=5))
    assert res.status == "failed" and res.step == 1
    assert "loss became nan at step 1" in res.error and "Lower the learning rate" in res.error


def test_a_bad_loss_fn_is_explained():
    res = train(Tiny(), lambda m, b: (m(b["x"]), {}), make_data(), cfg(max_steps=2))
    assert res.status == "failed" and "scalar tensor" in res.error and "[8, 3]" in res.error
    res = train(Tiny(), lambda m, b: torch.tensor(1.0), make_data(), cfg(max_steps=2))
    assert "does not depend on any trainable parameter" in res.error


def test_setup_errors_raise_at_once():
    with pytest.raises(ValueError, match="do not fill one optimizer step"):
        train(Tiny(), ce_loss, make_data(10), cfg(batch_size=8, grad_accum_steps=2))
    with pytest.raises(ValueError, match="warmup_steps or warmup_ratio"):
        TrainConfig(warmup_steps=10, warmup_ratio=0.1)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp16")
    with pytest.raises(TypeError, match="sequence of examples"):
        train(Tiny(), ce_loss, iter(make_data()), cfg())


def test_eval_runs_in_eval_mode_without_grad_and_is_recorded():
    modes = []

    def evaluate(model):
        modes.append((model.training, torch.is_grad_enabled()))
        return {"accuracy": torch.tensor(0.5), "confusion_matrix": [[1, 0], [0, 1]]}

    res = train(Tiny(), ce_loss, make_data(), cfg(max_steps=6, eval_every=3), eval_fn=evaluate)
    assert modes == [(False, False), (False, False)]  # steps 3 and 6, not twice at the end
    evals = [h for h in res.history if h["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 6]
    assert res.eval_metrics == {"accuracy": 0.5, "confusion_matrix": [[1.0, 0.0], [0.0, 1.0]]}
    json.dumps(res.history)


def test_tqdm_callback_follows_the_run(capsys):
    bar = TqdmCallback(disable=False, file=None)
    res = train(Tiny(), ce_loss, make_data(), cfg(max_steps=4, log_every=2), callbacks=[bar])
    assert res.ok and bar.bar is None
    assert "4/4" in capsys.readouterr().err


# -- with a real (tiny) BERT: pre-training MLM + NSP, HF-layout checkpoints ------------------
WORDS = ("the a cat dog bird sat ran flew on to over mat park tree house red big small old new "
         "and then it was happy sad home fast slow").split()
SENTENCES = [
    "the cat sat on the mat", "then it ran to the park", "a big dog was happy", "it ran home fast",
    "the small bird flew over the tree", "then it sat on the house", "an old cat was sad", "it was slow",
    "the red bird flew home", "a new dog sat on a mat",
]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    from bertlab.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("words")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return Tokenizer.from_folder(folder)


def nsp_examples(tok) -> list[dict]:
    """Sentence pairs: label 0 = B follows A in the list, 1 = B is another sentence."""
    out = []
    for i, a in enumerate(SENTENCES):
        for j in (i + 1, i + 3, i + 5):
            b = SENTENCES[j % len(SENTENCES)]
            enc = tok.encode(a, b)
            out.append({"input_ids": enc.ids, "token_type_ids": enc.type_ids, "label": int(j != i + 1)})
    return out


def tiny_bert(tok, seed: int = 0, dropout: float = 0.1):
    from bertlab.config import BertConfig
    from bertlab.families.bert import Bert

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, pretraining_heads=("mlm", "nsp"))
    return Bert(config)


def pretraining_loss(model, b) -> tuple[torch.Tensor, dict]:
    chosen = b.labels != -100  # [batch, seq]: the MLM head runs only there
    out = model(b.input_ids, b.token_type_ids, b.attention_mask, mlm_positions=chosen)
    mlm = F.cross_entropy(out.mlm_logits.float(), b.labels[chosen])  # [n, vocab] vs [n]
    nsp = F.cross_entropy(out.nsp_logits.float(), b.next_sentence_label)  # [batch, 2] vs [batch]
    return mlm + nsp, {"mlm_loss": mlm.detach(), "nsp_loss": nsp.detach()}


def test_pretraining_a_tiny_bert_learns_and_resumes_exactly(tmp_path: Path, word_tokenizer):
    from bertlab.training.masking import MaskingConfig, MLMCollator

    tok = word_tokenizer
    collate = MLMCollator(tok, MaskingConfig(mlm_probability=0.3))
    data = nsp_examples(tok)  # 30 pairs: 3 steps an epoch at batch 8
    c = dict(lr=1e-2, batch_size=8, max_steps=24, log_every=3, warmup_ratio=0.1)
    full = tiny_bert(tok)
    ref = train(full, pretraining_loss, data, cfg(**c, checkpoint_every=9, keep_last=None,
                                                  out_dir=str(tmp_path / "a")), collate=collate, tokenizer=tok)
    assert ref.ok, ref.error
    losses = [h["loss"] for h in ref.history]
    assert losses[-1] < 0.9 * losses[0] and {"mlm_loss", "nsp_loss"} <= ref.history[-1].keys()
    assert ref.history[-1]["tokens_per_s"] > 0

    resumed = tiny_bert(tok, seed=7)
    res = train(resumed, pretraining_loss, data, cfg(**c), collate=collate, resume_from=tmp_path / "a" / "checkpoint-9")
    assert res.ok and res.step == 24
    assert_same(weights(resumed), weights(full))


def test_bert_checkpoints_load_in_bertlab_and_transformers(tmp_path: Path, word_tokenizer):
    import transformers

    from bertlab.loading import load
    from bertlab.training.masking import MLMCollator

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    tok = word_tokenizer
    model = tiny_bert(tok)
    res = train(model, pretraining_loss, nsp_examples(tok), cfg(lr=3e-3, max_steps=3, out_dir=str(tmp_path)),
                collate=MLMCollator(tok), tokenizer=tok)
    folder = res.last_checkpoint
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "trainer_state.json"} <= {
        p.name for p in folder.iterdir()}

    ours, ours_tok = load(folder)
    assert ours_tok.encode("the cat sat").ids == tok.encode("the cat sat").ids
    hf = transformers.BertForPreTraining.from_pretrained(folder, attn_implementation="eager").eval()
    batch = tok.encode_batch(["the cat sat on the mat", "a dog"], ["it was happy", "then it ran home fast"])
    model.eval()
    with torch.no_grad():
        mine = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        reloaded = ours(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        theirs = hf(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                    attention_mask=batch.attention_mask)
    torch.testing.assert_close(reloaded.mlm_logits, mine.mlm_logits, atol=0, rtol=0)
    torch.testing.assert_close(theirs.prediction_logits, mine.mlm_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(theirs.seq_relationship_logits, mine.nsp_logits, atol=1e-5, rtol=1e-4)


# -- memory and precision on a CPU -----------------------------------------------------------------
def test_a_cpu_run_hands_the_heap_back_at_the_end(monkeypatch):
    from bertlab.training import loop

    calls = []
    monkeypatch.setattr(loop, "release_free_memory", lambda: calls.append(1) or True)
    assert train(Tiny(), ce_loss, make_data(), cfg(max_steps=5)).ok
    assert len(calls) == 1  # only when the run ends


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trimming_gives_freed_heap_memory_back_to_the_system():
    from bertlab.runtime import release_free_memory

    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: these blocks come from the heap, as after glibc's own raising
    try:
        blocks = [libc.malloc(256 * 1024) for _ in range(1600)]  # 400 MB of heap blocks, touched
        for b in blocks:
            ctypes.memset(b, 1, 256 * 1024)
        keep = blocks[-1]  # one block at the top keeps glibc from shrinking the heap by itself
        for b in blocks[:-1]:
            libc.free(b)
        before = rss_mb()
        assert release_free_memory() is True
        assert rss_mb() < before - 300  # the freed pages in the middle of the heap went back
        libc.free(keep)
    finally:
        libc.mallopt(-3, 128 * 1024)


def test_auto_precision_means_bf16_only_where_the_device_has_it_natively(monkeypatch):
    from bertlab.training import loop

    cpu = torch.device("cpu")
    assert loop.resolve_precision("fp32", cpu) == "fp32" and loop.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(loop, "native_bf16", lambda device: False)
    assert loop.resolve_precision("auto", cpu) == "fp32"
    assert isinstance(loop.autocast_context("auto", cpu), contextlib.nullcontext)
    monkeypatch.setattr(loop, "native_bf16", lambda device: True)
    assert loop.resolve_precision("auto", cpu) == "bf16"
    with loop.autocast_context("auto", cpu):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    events = []
    train(Tiny(), ce_loss, make_data(), cfg(max_steps=1), callbacks=[events.append])
    assert "bf16 autocast" in events[0].message  # the run says what it computes in


def test_native_bf16_on_a_cpu_reads_its_flags(monkeypatch):
    """A CPU multiplies bf16 natively when /proc/cpuinfo lists AVX-512 BF16 or AMX BF16; no flags: fp32."""
    from bertlab.training import loop

    cpu = torch.device("cpu")
    for flags, native in ((frozenset({"avx2", "avx512_bf16"}), True), (frozenset({"amx_bf16"}), True),
                          (frozenset({"avx2", "avx512f"}), False), (frozenset(), False)):
        monkeypatch.setattr(loop, "cpu_flags", lambda flags=flags: flags)
        assert loop.native_bf16(cpu) is native
    monkeypatch.undo()
    loop.cpu_flags.cache_clear()
    if sys.platform.startswith("linux"):
        assert loop.cpu_flags()  # this machine's flags were read
