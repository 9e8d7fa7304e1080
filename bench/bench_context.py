"""How much context does BERT use? The offline default's masked-word accuracy on held-out WikiText-2 when
each layer group's attention is cut to ±w positions (bertlab.analysis.context_window). Where a window
costs nothing, cheaper attention (Longformer's windows, ModernBERT's local layers) is free.

    python bench/bench_context.py [--model NAME_OR_FOLDER] [--max-tokens 20000]
        [--out bench/results/context_window.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "context_window.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="hub name or folder (default: the offline default)")
    p.add_argument("--max-tokens", type=int, default=20_000, help="tokens of held-out text read per row")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    import torch

    from bertlab.analysis.context_window import WINDOWS, as_dicts, context_curve, score_points
    from bertlab.loading import load
    from bertlab.training.corpora import load_corpus
    from bertlab.training.pretrain import evaluate_mlm

    torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    docs = load_corpus("wikitext2", split="held_out")
    start = time.perf_counter()
    rows = context_curve(model.eval(), lambda m: evaluate_mlm(m, tok, docs, max_tokens=args.max_tokens), WINDOWS)
    full = rows[0].top1
    result = {
        "meta": {"model": args.model or "offline default (MiniLM-L6 + bertlab's heads)",
                 "layers": len(score_points(model)),
                 "text": "WikiText-2 valid (held out), 15 % of tokens masked with a fixed seed, every one [MASK]",
                 "masked_tokens": rows[0].masked_tokens, "seq_len": 128,
                 # a row's binomial standard error, in points: differences within about twice it are noise
                 "se_points": round(100 * (full * (1 - full) / rows[0].masked_tokens) ** 0.5, 1),
                 "machine": platform.machine(),
                 "cpus": os.cpu_count(), "torch": torch.__version__, "seconds": round(time.perf_counter() - start),
                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])},
        "rows": [{**r, "window": "full" if r["window"] is None else f"±{r['window']}",
                  "top1_vs_full": r["top1"] - full} for r in as_dicts(rows)],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"full_top1": full, "rows": len(rows), "seconds": result["meta"]["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
