"""Fill-mask latency: bertlab's `fill_mask` against Hugging Face's `pipeline("fill-mask")`, same weights.

Both sides run the offline default as `bertlab.load()` gives it (the MiniLM encoder + bertlab's MLM head):
the HF side loads the very same weights, written once by `bertlab.loading.save_pretrained` into a
temporary folder, as `BertForMaskedLM`. One call = one sentence with one [MASK] in, the top 5 out (text
to guesses, tokenizing included), as the Mask tab asks. The two take turns call by call (in alternating
order) so background load hits them alike; medians after two warm-up calls each. The script stops if
the two disagree on a top 5. Prints a markdown table (ratio = bertlab / HF: below 1 = bertlab faster)
and writes bench/results/fillmask.json.

    python bench/bench_fillmask.py [--quick] [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

# Short everyday sentences, as a student types them; one [MASK] each.
SENTENCES = (
    "The man went to the [MASK] store.",
    "She poured a cup of [MASK] and sat down.",
    "Paris is the capital of [MASK].",
    "The children played in the [MASK] after school until their parents called them home for dinner.",
    "He could not sleep because the dog next door [MASK] all night.",
)
AIM = 0.8  # bertlab's time / HF's, at most


def _time_turns(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each `fn()`, after two warm-up calls each; the variants take turns."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def build(folder: str):
    """(bertlab model, bertlab tokenizer, HF fill-mask pipeline) on the same weights."""
    import transformers

    import bertlab
    from bertlab.loading import save_pretrained

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model, tok = bertlab.load()
    save_pretrained(model, tok, folder)
    hf = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    pipe = transformers.pipeline("fill-mask", model=hf, tokenizer=hf_tok, device="cpu")
    return model, tok, pipe


def top5(model, tok, pipe, text: str) -> tuple[list[str], list[str]]:
    from bertlab.analysis.mask import fill_mask

    ours = [c.token for c in fill_mask(model, tok, text, k=5)[0].candidates]
    theirs = [d["token_str"].strip() for d in pipe(text, top_k=5)]
    return ours, theirs


def run(sentences: list[str], repeats: int) -> list[dict]:
    from bertlab.analysis.mask import fill_mask

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model, tok, pipe = build(folder)
        for text in sentences:
            ours, theirs = top5(model, tok, pipe, text)
            if ours != theirs:
                raise SystemExit(f"the top 5 differ for {text!r}: bertlab {ours}, HF {theirs}; timings would "
                                 "compare different work.")
            t = _time_turns({
                "bertlab": lambda: fill_mask(model, tok, text, k=5),
                "hf_pipeline": lambda: pipe(text, top_k=5),
            }, repeats)
            row = {"text": text, "tokens": len(tok.encode(text)), "top5": ours,
                   "bertlab_ms": round(t["bertlab"] * 1000, 2), "hf_pipeline_ms": round(t["hf_pipeline"] * 1000, 2),
                   "ratio_vs_hf": round(t["bertlab"] / t["hf_pipeline"], 3)}
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


HEADER = "| sentence | tokens | bertlab ms | HF pipeline ms | ratio | same top 5 |\n|---|---|---|---|---|---|"


def _fmt(r: dict) -> str:
    return (f"| {r['text'][:40]} | {r['tokens']} | {r['bertlab_ms']} | {r['hf_pipeline_ms']} | {r['ratio_vs_hf']} "
            f"| yes |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="torch threads (class mode runs kernels on 1)")
    p.add_argument("--device", default="cpu", choices=["cpu"], help="CPU only: the class server's case")
    p.add_argument("--quick", action="store_true", help="3 repeats, two sentences")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "fillmask.json"))
    a = p.parse_args()
    sentences = list(SENTENCES)
    if a.quick:
        a.repeats, sentences = 3, sentences[:2]
    torch.set_num_threads(a.threads)
    print(HEADER)
    rows = run(sentences, a.repeats)
    ratio = statistics.median(r["ratio_vs_hf"] for r in rows)
    summary = {"median_ratio_vs_hf": round(ratio, 3), "aim": AIM, "within_aim": ratio <= AIM,
               "median_bertlab_ms": round(statistics.median(r["bertlab_ms"] for r in rows), 2),
               "median_hf_pipeline_ms": round(statistics.median(r["hf_pipeline_ms"] for r in rows), 2)}
    print(f"\nmedian ratio bertlab / HF pipeline: {summary['median_ratio_vs_hf']} (aim <= {AIM})")
    meta = {"torch": torch.__version__, "threads": a.threads, "cpu": platform.processor() or platform.machine(),
            "device": "cpu", "repeats": a.repeats, "model": "offline default (MiniLM-L6 + bertlab heads)"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
