"""Cheaper attention, measured: full attention against a sliding window with global tokens (Longformer's mask,
`bertlab.masks.sliding_window`), for lengths 128 to 4,096 on this CPU.

Four variants of one attention call (q, k, v: [1, heads, n, d_head], random, float32), on the same inputs:
  eager     full attention with its [heads, n, n] pattern made, as eager attention (and every view) does
  sdpa      torch's fused scaled_dot_product_attention, no mask: every query reads every key (n² pairs)
  masked    the same call with the window mask as attn_mask: the same n² scores, then most thrown away
  banded    the same window computed block by block (Longformer's sliding chunks,
            `bertlab.analysis.window_cost.banded_attention`): queries in blocks of
            `window`, each scored only against the 3 · window keys around its block and the global keys, and
            the global queries against all (about n · (3 · window + globals) pairs)
`banded` is checked equal to `masked` at every length (max abs difference in the results file). Time: the median
of `--repeats` calls, variants taking turns. Memory: the peak resident memory the call adds over its inputs,
measured in a fresh process per variant and length (Linux's VmHWM, reset just before the call).
Writes bench/results/attention_window.json.

    python bench/bench_attention.py [--lengths 128 256 ... 4096] [--window 64] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bertlab import masks  # noqa: E402
from bertlab.analysis.window_cost import banded_attention, banded_pairs  # noqa: E402

VARIANTS = ("eager", "sdpa", "masked", "banded")


def inputs(n: int, heads: int, d_head: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, d_head, generator=g) for _ in range(3))  # each [1, head, n, d_head]


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d) v with the [batch, head, n, n] pattern made (as eager attention and the views do)."""
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)).softmax(dim=-1) @ v


def call(variant: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
         mask: torch.Tensor | None) -> torch.Tensor:
    if variant == "eager":
        return eager_attention(q, k, v)
    if variant == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    if variant == "masked":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return banded_attention(q, k, v, window)


def pairs(variant: str, n: int, window: int) -> int:
    """Query-key scores the variant computes."""
    return banded_pairs(n, window) if variant == "banded" else n * n


def timings(n: int, heads: int, d_head: int, window: int, repeats: int) -> tuple[dict[str, float], float]:
    """Median ms of each variant (taking turns, after a warm-up call each) and max |banded - masked|."""
    q, k, v = inputs(n, heads, d_head)
    mask = masks.sliding_window(n, window, (0,))  # [n, n] bool, the grid the views draw
    with torch.inference_mode():
        diff = float((call("banded", q, k, v, window, mask) - call("masked", q, k, v, window, mask)).abs().max())
        for variant in VARIANTS:
            call(variant, q, k, v, window, mask)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(repeats):
            for name in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                t = time.perf_counter()
                call(name, q, k, v, window, mask)
                times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(ts) for name, ts in times.items()}, diff


def peak_mib(variant: str, n: int, heads: int, d_head: int, window: int, threads: int) -> float:
    """Peak resident memory one call adds over its inputs (and the mask `masked` is given), MiB, in a fresh process."""
    cmd = [sys.executable, __file__, "--worker", variant, "--threads", str(threads), "--window", str(window),
           "--heads", str(heads), "--d-head", str(d_head), "--lengths", str(n)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def worker(variant: str, n: int, heads: int, d_head: int, window: int) -> None:
    q, k, v = inputs(n, heads, d_head)
    mask = masks.sliding_window(n, window, (0,)) if variant == "masked" else None
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident size starts again from now
    before = _status_kib("VmRSS")
    with torch.inference_mode():
        call(variant, q, k, v, window, mask)
    print(round((_status_kib("VmHWM") - before) / 1024, 1))


def _status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS: now; VmHWM: the peak), KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--window", type=int, default=64, help="tokens seen on each side (ModernBERT: local_attention / 2)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu"])
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_window.json"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.worker:
        worker(a.worker, a.lengths[0], a.heads, a.d_head, a.window)
        return
    load_start = os.getloadavg()
    rows = []
    print("| n | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | sdpa ÷ banded | "
          + " | ".join(f"{v} MiB" for v in VARIANTS) + " |")
    for n in a.lengths:
        ms, diff = timings(n, a.heads, a.d_head, a.window, a.repeats)
        mib = {name: peak_mib(name, n, a.heads, a.d_head, a.window, a.threads) for name in VARIANTS}
        row = {"seq": n, **{f"{name}_ms": round(ms[name], 2) for name in VARIANTS},
               **{f"{name}_peak_mib": mib[name] for name in VARIANTS},
               **{f"{name}_pairs": pairs(name, n, a.window) for name in VARIANTS},
               "sdpa_over_banded": round(ms["sdpa"] / ms["banded"], 2),
               "masked_over_banded": round(ms["masked"] / ms["banded"], 2),
               "banded_max_abs_diff": diff}
        rows.append(row)
        print(f"| {n} | " + " | ".join(f"{ms[v]:.1f}" for v in VARIANTS) + f" | {row['sdpa_over_banded']} | "
              + " | ".join(str(mib[v]) for v in VARIANTS) + " |", flush=True)
    meta = {"device": "cpu", "cpu": cpu_name(), "torch": torch.__version__,
            "threads": a.threads, "window": a.window, "globals": 1, "heads": a.heads, "d_head": a.d_head,
            "batch": 1, "dtype": "float32", "repeats": a.repeats,
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python bench/bench_attention.py " + " ".join(sys.argv[1:])}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
