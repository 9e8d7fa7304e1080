"""MLM pre-training throughput of bertlab against Hugging Face's BertForMaskedLM: same shape, same weights,
same batches, same precision, same optimizer.

Both models take the same masked batches (bertlab's `MLMCollator`, 15 % of the tokens chosen, 80/10/10)
of full-length random-token sequences, start from the same weights (HF's initialisation copied into
bertlab with its strict loader, and checked: both give the same loss before training), and train with
the same AdamW (`training.loop.make_optimizer`: torch's fused kernel, no decay on biases/LayerNorm), global
gradient clipping at 1.0 (HF: `clip_grad_norm_` then `step()`, as its `Trainer`; bertlab's variants:
`training.loop.clip_and_step`, as its loop: the same clip, taken by the fused step), and the same precision:
`--precision` fp32, bf16 (autocast around both models' forward, as HF's `Trainer` does with bf16=True) or auto
(bf16 on CUDA and on CPUs with native bf16, else fp32); several precisions give one set of rows each, HF against
bertlab within a precision. Variants:

  hf                 `BertForMaskedLM` (attn_implementation="sdpa"), `labels` with -100 off the masked
                     positions: its vocabulary projection runs on ALL positions
  bertlab            `Bert` with an MLM head and the pre-training lab's own loss
                     (`training.pretrain.mlm_nsp_loss`, which also reads accuracy metrics): the head runs
                     only on the masked positions (`mlm_positions`), attention is fused SDPA
  bertlab-lean       the same model, a loss without metrics (no `.item()` host syncs)
  bertlab-full-head  bertlab with the head on all positions, as HF: separates the implementation from
                     the algorithmic saving of predicting only where it is needed

Each step (forward, backward, clip, optimizer step) is timed
alone, with `torch.cuda.synchronize()` around it on GPU. The variants take turns step by step (warm-up rounds,
then timed rounds, the order rotated each round), so that a machine shared with other work slows them alike.
The table gives the median step, tokens/s (batch x seq tokens per step), the speed-up against HF (above 1 = faster than
HF) and, on GPU, each variant's peak memory (its weights and optimizer state plus its largest step).

MFU (GPU only) counts the FLOPs the task needs, the same numerator for every variant:

    FLOPs/step = 6 * N * T                      (N: encoder-layer parameters, embeddings excluded; T = batch * seq)
               + 12 * L * H * S * T             (attention scores and weighted sum, forward + backward)
               + 6 * (H * H + H * V) * M        (MLM head: transform + decoder, on the M masked positions)
    MFU = FLOPs/step / (median step seconds) / (peak FLOP/s)     peak = --peak-tflops, else the GPU's dense
                                                                 bf16 peak by its name (PEAK_BF16_TFLOPS)

HFU (hardware FLOPs utilisation) counts the head on the positions a variant really computes (T for
`hf` and `bertlab-full-head`), so HFU - MFU is the compute spent on unmasked positions.

Each variant's matmul work is also counted, not estimated: one untimed step under torch's `FlopCounterMode`
(forward and backward; the linears, the heads and the attention products torch has formulas for: on a CPU its fused
attention kernels have none, so the counts leave the attention scores out, for both libraries). `matmul_work_vs_hf`
(HF's count / the variant's) is the speed-up that doing less arithmetic alone would give, kernel for kernel: what
a like-for-like speed-up above it must come from elsewhere (fewer passes over memory, less Python).

    python bench/bench_pretrain.py [--quick] [--device cpu|cuda] [--presets minilm base] [--batch 8] [--seq 128]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# name -> (layers, hidden, heads, intermediate); the vocabulary is VOCAB_SIZE.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),  # for smoke tests only
    "minilm": (6, 384, 12, 1536),  # the offline default's shape (all-MiniLM-L6-v2)
    "base": (12, 768, 12, 3072),  # BERT-base
}
VARIANTS = ("hf", "bertlab", "bertlab-lean", "bertlab-full-head")
DEFAULT_VARIANTS = VARIANTS
# Dense (no sparsity) bf16 peak TFLOP/s from the vendors' data sheets, by a piece of the name torch reports
# (`torch.cuda.get_device_name`); the first piece found in the name wins, so the more specific come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("H200", 989.0), ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0),
    ("L4", 121.0),
)
VOCAB_SIZE = 30522  # the offline default's WordPiece vocabulary (bert-base-uncased), which masks the batches

LossFn = Callable[[nn.Module, object], torch.Tensor]


@dataclass
class Setup:
    """One comparison: the device, the shape, and the batches every variant trains on."""

    device: torch.device
    batches: list  # list[MLMBatch] already on the device
    vocab_size: int
    preset: str
    batch: int
    seq: int


# -- models ------------------------------------------------------------------------------------
def build_models(preset: str, vocab_size: int, seq: int, seed: int) -> tuple[nn.Module, nn.Module]:
    """(HF BertForMaskedLM, bertlab Bert with the MLM head) of one preset, with the same weights."""
    import transformers

    from bertlab.config import BertConfig
    from bertlab.families.bert import Bert
    from bertlab.loading import check_state, normalise_keys

    layers, hidden, heads, inter = PRESETS[preset]
    hf_cfg = transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=inter, max_position_embeddings=max(512, seq), architectures=["BertForMaskedLM"],
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    hf = transformers.BertForMaskedLM(hf_cfg)
    if hf.config._attn_implementation != "sdpa":
        raise RuntimeError(f"HF built {hf.config._attn_implementation!r} attention, not sdpa.")
    ours = Bert(BertConfig.from_hf_dict(hf_cfg.to_dict()).replace(add_pooler=False))
    state = normalise_keys(hf.state_dict())
    check_state(ours, state, Path(f"<HF BertForMaskedLM {preset}>"))
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    ours.load_state_dict(state, strict=True)
    ours.tie_weights()
    return hf, ours


def encoder_params(model: nn.Module) -> int:
    """N in the MFU formula: parameters of the encoder layers (no embeddings, no heads)."""
    return sum(p.numel() for p in model.bert.encoder.parameters())


# -- losses ------------------------------------------------------------------------------------
def hf_loss(model: nn.Module, batch) -> torch.Tensor:
    """HF's own loss: logits on every position, cross-entropy with -100 labels."""
    return model(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                 attention_mask=batch.attention_mask, labels=batch.labels).loss


def lab_loss(model: nn.Module, batch) -> torch.Tensor:
    """The pre-training lab's loss (`mlm_nsp_loss`), metrics and all."""
    from bertlab.training.pretrain import mlm_nsp_loss

    return mlm_nsp_loss(model, batch)[0]


def lean_loss(model: nn.Module, batch) -> torch.Tensor:
    """MLM cross-entropy on the masked positions only, no metrics."""
    picked = batch.labels != -100  # [batch, seq]
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked)
    return F.cross_entropy(out.mlm_logits.float(), batch.labels[picked])


def full_head_loss(model: nn.Module, batch) -> torch.Tensor:
    """bertlab with the MLM head on every position (what HF does)."""
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
    return F.cross_entropy(out.mlm_logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=-100)


LOSSES: dict[str, LossFn] = {"hf": hf_loss, "bertlab": lab_loss, "bertlab-lean": lean_loss,
                             "bertlab-full-head": full_head_loss}


# -- data --------------------------------------------------------------------------------------
def make_batches(n: int, batch: int, seq: int, seed: int, device: torch.device) -> list:
    """`n` masked MLMBatches of full-length random-token sequences ([CLS] ... [SEP]), on `device`."""
    from bertlab.loading import default_model_folder
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.loop import move_to_device
    from bertlab.training.masking import MLMCollator

    tok = Tokenizer.from_folder(default_model_folder())
    collate = MLMCollator(tok, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        body = torch.randint(1000, tok.vocab_size, (batch, seq - 2), generator=g)  # [batch, seq - 2]
        rows = [{"input_ids": [tok.cls_token_id, *r.tolist(), tok.sep_token_id]} for r in body]
        out.append(move_to_device(collate(rows, generator=g), device))
    return out


# -- timing ------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class VariantRun:
    """One variant's model, optimizer and step; `step()` trains on the next batch and returns its seconds."""

    def __init__(self, variant: str, model: nn.Module, setup: Setup, compile_model: bool, precision: str) -> None:
        from bertlab.training.loop import TrainConfig, make_optimizer

        self.variant, self.setup, self.device, self.precision = variant, setup, setup.device, precision
        self.model = model.to(self.device).train()
        self.optimizer = make_optimizer(self.model, TrainConfig(lr=1e-4), self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.runner = torch.compile(self.model) if compile_model else self.model
        self.loss_fn = LOSSES[variant]
        self.done = 0
        self.times: list[float] = []
        self.transient_peak = 0  # bytes a step allocates on top of what was there before it (GPU)

    def step(self, timed: bool) -> None:
        from bertlab.training.loop import autocast_context, clip_and_step

        cuda = self.device.type == "cuda"
        _sync(self.device)
        if cuda:
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t = time.perf_counter()
        i = self.done % len(self.setup.batches)
        batch = self.setup.batches[i]
        with autocast_context(self.precision, self.device):
            loss = self.loss_fn(self.runner, batch)
        loss.backward()
        if self.variant == "hf":  # what HF's Trainer does
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
        else:  # what bertlab's loop does
            clip_and_step(self.optimizer, self.params, 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        _sync(self.device)
        if timed:
            self.times.append(time.perf_counter() - t)
        if cuda:
            self.transient_peak = max(self.transient_peak, torch.cuda.max_memory_allocated(self.device) - before)
        self.done += 1

    def peak_mem_mb(self) -> int | None:
        """Peak GPU memory of this variant alone: its weights and optimizer state plus its largest step."""
        if self.device.type != "cuda":
            return None
        tensors = [*self.model.parameters(), *self.model.buffers()]
        tensors += [t for st in self.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        persistent = sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())
        return round((persistent + self.transient_peak) / 2**20)


def matmul_flops(run: VariantRun) -> int:
    """The matmul FLOPs of one (untimed) training step of this variant, as torch's `FlopCounterMode` counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run.step(timed=False)
    return counter.get_total_flops()


# What a piece of work is, by the name the profiler gives it (an aten op on a CPU, a kernel on a GPU); the first
# kind whose pieces the lower-cased name contains wins, so the more specific come first.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "logsoftmax")),
    ("attention", ("flash", "fmha", "attention", "softmax")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "philox", "aten::random_")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "vector_norm", "clip_grad")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::baddbmm", "aten::matmul")),
    ("memory", ("copy", "cast", "cat", "index", "gather", "scatter", "embedding", "fill", "zero")),
    ("elementwise", ("elementwise", "reduce_kernel", "aten::add", "aten::mul", "aten::div", "aten::sub",
                     "aten::sum", "aten::gelu", "aten::tanh", "aten::where", "aten::neg", "aten::sqrt",
                     "aten::rsub", "aten::masked_fill", "aten::relu", "aten::threshold", "aten::ge")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pieces in KINDS if any(piece in low for piece in pieces)), "other")


def profile_steps(run: VariantRun, steps: int) -> dict:
    """Where `steps` more training steps of a variant spend their time (torch.profiler): per step, the wall time
    (the profiler's own cost included), the time the work is busy (the GPU's kernels; on a CPU its ops' own time)
    and that time by kind of work (`KINDS`), the costliest ops, and on a GPU the kernel launches (a step of many
    small kernels leaves the GPU waiting on the host: wall far above busy)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = run.device.type == "cuda"
    _sync(run.device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            run.step(timed=False)
        wall = time.perf_counter() - t
    want = DeviceType.CUDA if cuda else DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == want]
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)  # microseconds
    if not cuda:  # on a CPU: the aten ops (ranges such as Optimizer.step's hold only Python between ops)
        events = [e for e in events if e.key.startswith("aten::")]
    busy = sum(own(e) for e in events)
    by_kind: dict[str, float] = {}
    for e in events:
        kind = kind_of(e.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + own(e)
    top = sorted(events, key=own, reverse=True)[:12]
    return {
        "steps": steps, "clock": "GPU kernels" if cuda else "CPU ops (self time)",
        "wall_ms_per_step": round(wall * 1000 / steps, 2),
        "busy_ms_per_step": round(busy / 1000 / steps, 2),
        "by_kind_ms_per_step": {k: round(v / 1000 / steps, 3)
                                for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "launches_per_step": round(sum(e.count for e in events) / steps, 1) if cuda else None,
        "top": [{"name": e.key[:100], "kind": kind_of(e.key), "ms_per_step": round(own(e) / 1000 / steps, 3),
                 "calls_per_step": round(e.count / steps, 1)} for e in top],
    }


def profile_or_error(run: VariantRun, steps: int) -> dict:
    """`profile_steps`, or {"error": why} when the profiler fails: the timed figures stand without it."""
    try:
        return profile_steps(run, steps)
    except Exception as err:  # a profiler that cannot run here (e.g. no CUPTI) must not cost the timings
        logging.getLogger(__name__).warning("profiling %s failed: %s", run.variant, err)
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def time_variants(runs: list[VariantRun], warmup: int, steps: int) -> None:
    """Warm-up, then timed rounds; each round steps every variant once, in an order rotated per round,
    so that a machine shared with other work slows all variants alike."""
    for r in range(warmup + steps):
        k = r % len(runs)
        for run in runs[k:] + runs[:k]:
            run.step(timed=r >= warmup)


@torch.no_grad()
def check_same_loss(hf: nn.Module, ours: nn.Module, setup: Setup) -> float:
    """|HF loss - bertlab loss| on the first batch in eval mode (fp32): proves they compute the same thing."""
    batch = setup.batches[0]
    losses = []
    for model, fn in ((hf, hf_loss), (ours, lean_loss)):
        model.to(setup.device).eval()
        losses.append(float(fn(model, batch)))
        model.to("cpu")
    diff = abs(losses[0] - losses[1])
    if diff > 1e-3 * max(1.0, abs(losses[0])):
        raise RuntimeError(f"HF and bertlab disagree before training (loss {losses[0]:.5f} vs {losses[1]:.5f}): "
                           f"the comparison would not be like for like.")
    return diff


def flops_per_step(n_enc: int, layers: int, hidden: int, vocab: int, seq: int, tokens: int,
                   head_positions: int) -> float:
    """Training FLOPs of one step (see the module docstring); the MLM head on `head_positions`."""
    return (6 * n_enc * tokens + 12 * layers * hidden * seq * tokens
            + 6 * (hidden * hidden + hidden * vocab) * head_positions)


def known_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak TFLOP/s of the GPU called `name` (as torch names it), or None when not in the table."""
    return next((tflops for piece, tflops in PEAK_BF16_TFLOPS if piece.lower() in name.lower()), None)


# -- one preset --------------------------------------------------------------------------------
def run_preset(preset: str, a: argparse.Namespace, device: torch.device, precision: str) -> list[dict]:
    """The rows of one shape in one precision ("fp32" or "bf16"): every variant on the same batches."""
    batches = make_batches(a.batches, a.batch, a.seq, a.seed, device)
    vocab = VOCAB_SIZE
    setup = Setup(device, batches, vocab, preset, a.batch, a.seq)
    hf, ours = build_models(preset, vocab, a.seq, a.seed)
    loss_diff = check_same_loss(hf, ours, setup)
    layers, hidden, _, _ = PRESETS[preset]
    n_enc = encoder_params(ours)
    tokens = a.batch * a.seq
    masked = statistics.mean(int((b.labels != -100).sum()) for b in batches)
    needed = flops_per_step(n_enc, layers, hidden, vocab, a.seq, tokens, masked)
    runs = [VariantRun(v, copy.deepcopy(hf if v == "hf" else ours), setup, a.compile, precision)  # same weights
            for v in a.variants]
    work = {run.variant: matmul_flops(run) for run in runs}
    time_variants(runs, a.warmup, a.steps)
    profiles = {run.variant: profile_or_error(run, a.profile) for run in runs} if a.profile else {}
    peak = a.peak_tflops * 1e12 if device.type == "cuda" else None
    medians = {run.variant: statistics.median(run.times) for run in runs}
    hf_times = next((run.times for run in runs if run.variant == "hf"), None)
    rows = []
    for run in runs:
        sec = medians[run.variant]
        head_positions = tokens if run.variant in ("hf", "bertlab-full-head") else masked
        done = flops_per_step(n_enc, layers, hidden, vocab, a.seq, tokens, head_positions)
        row = {
            "preset": preset, "variant": run.variant, "precision": precision, "batch": a.batch, "seq": a.seq,
            "masked_per_step": round(masked, 1), "ms_per_step": round(sec * 1000, 2),
            "ms_per_step_min": round(min(run.times) * 1000, 2), "tokens_per_s": round(tokens / sec, 1),
            "speedup_vs_hf": round(medians["hf"] / sec, 3) if "hf" in medians else None,
            # each timed round's own ratio (the variants took turns step by step): the figure's spread
            "speedup_vs_hf_per_step": [round(h / t, 3) for h, t in zip(hf_times, run.times)] if hf_times else None,
            "mfu": round(needed / sec / peak, 4) if peak else None,
            "hfu": round(done / sec / peak, 4) if peak else None,
            "peak_mem_mb": run.peak_mem_mb(), "loss_diff_before_training": loss_diff, "encoder_params": n_enc,
            "matmul_gflop_per_step": round(work[run.variant] / 1e9, 2),
            "matmul_work_vs_hf": round(work["hf"] / work[run.variant], 3) if "hf" in work else None,
        }
        if run.variant in profiles:
            row["profile"] = profiles[run.variant]
        rows.append(row)
        print(_fmt(row), flush=True)
    del runs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


HEADER = ("| preset | variant | precision | batch | seq | ms/step | tokens/s | speed-up vs HF | MFU | HFU "
          "| peak MiB |\n" + "|---" * 11 + "|")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _fmt(r: dict) -> str:
    return (f"| {r['preset']} | {r['variant']} | {r['precision']} | {r['batch']} | {r['seq']} | {r['ms_per_step']} | "
            f"{r['tokens_per_s']:.0f} | {r['speedup_vs_hf'] if r['speedup_vs_hf'] is not None else '-'} | "
            f"{_pct(r['mfu'])} | {_pct(r['hfu'])} | {r['peak_mem_mb'] if r['peak_mem_mb'] is not None else '-'} |")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--presets", nargs="+", choices=tuple(PRESETS), default=["minilm", "base"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS),
                   help=f"default: {' '.join(DEFAULT_VARIANTS)}")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 128 on cuda, 8 on cpu)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 30 on cuda, 5 on cpu)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10 on cuda, 2 on cpu)")
    p.add_argument("--batches", type=int, default=4, help="distinct masked batches, cycled")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after timing, profile this many more steps of each variant (untimed): where a step's time "
                        "goes, by kind of work, into each row's 'profile'")
    p.add_argument("--precision", nargs="+", choices=("auto", "fp32", "bf16"), default=["auto"],
                   help="what both models' products run in (one set of rows each); auto: bf16 on CUDA and on "
                        "CPUs with native bf16, else fp32")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak dense bf16 TFLOP/s for MFU (default: the GPU's, by its name; see PEAK_BF16_TFLOPS)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="MiniLM shape, hf and bertlab only, few steps")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "pretrain.json"))
    a = p.parse_args()
    gpu = a.device == "cuda"
    a.batch = a.batch or (128 if gpu else 8)
    a.steps = a.steps or (30 if gpu else 5)
    a.warmup = a.warmup if a.warmup is not None else (10 if gpu else 2)
    if a.quick:
        a.presets, a.variants = [p for p in a.presets if p != "base"] or a.presets, ["hf", "bertlab"]
        a.steps, a.warmup = min(a.steps, 3), min(a.warmup, 1)
    if "hf" in a.variants:
        a.variants = ["hf"] + [v for v in a.variants if v != "hf"]  # HF first: the ratios need it
    return a


def main() -> None:
    a = _parse()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but CUDA is not available here; use --device cpu.")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    gpu = torch.cuda.get_device_name(device) if a.device == "cuda" else None
    if gpu is not None and a.peak_tflops is None:
        a.peak_tflops = known_peak_tflops(gpu)
        if a.peak_tflops is None:
            raise SystemExit(f"the bf16 peak of {gpu!r} is not in PEAK_BF16_TFLOPS: give it with --peak-tflops "
                             f"(dense, no sparsity, from the data sheet).")
    print(HEADER)
    load_start = [round(x, 2) for x in os.getloadavg()]
    from bertlab.training.loop import resolve_precision

    precisions = list(dict.fromkeys(resolve_precision(p, device) for p in a.precision))
    rows = [row for prec in precisions for preset in a.presets for row in run_preset(preset, a, device, prec)]
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "device": a.device,
            "gpu": gpu, "cpu": platform.processor() or platform.machine(), "threads": a.threads,
            "precision": " and ".join("bf16 autocast" if p == "bf16" else p for p in precisions), "steps": a.steps,
            "warmup": a.warmup, "compile": a.compile, "profile_steps": a.profile,
            "heap": "default" if a.device == "cpu" else None,
            "load_avg_start": load_start, "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "peak_tflops": a.peak_tflops if a.device == "cuda" else None}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
