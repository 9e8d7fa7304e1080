"""How each model guesses the lectures' classic sentences (bertlab.analysis.classics): for each, is an
acceptable answer among its top 5, and what those 5 are. The figure the picker's card shows, for the
docs (docs/models.md, "Before class").

Scores the offline default, and each `--model` (a hub name from the cache, or a folder). A hub name not
in this machine's cache is written as not measured, with the step that gets it (`bertlab download
NAME` while online): bert-base-uncased needs a machine with internet once.

    python bench/bench_panel.py [--model bert-base-uncased] [--out bench/results/classic_panel.json]
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
OUT = REPO / "bench" / "results" / "classic_panel.json"
DEFAULT = "offline default (MiniLM-L6)"


def score(source: str | None) -> dict:
    from bertlab.analysis.classics import TOP_K, guess_classics
    from bertlab.loading import load

    model, tok = load(source)
    t = time.perf_counter()
    results = guess_classics(model, tok)
    ms = (time.perf_counter() - t) * 1000
    return {"model": source or DEFAULT, "measured": True, "hits": sum(r.hit for r in results), "total": len(results),
            "k": TOP_K, "forward_ms": round(ms, 1),
            "sentences": [{"sentence": r.sentence, "top": list(r.top), "hit": r.hit} for r in results]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=[], help="a hub name (from the cache) or a folder (repeat)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    import torch

    from bertlab.settings import in_hub_cache

    torch.set_num_threads(args.threads)
    rows = [score(None)]
    for source in args.model:
        if not Path(source).exists() and not in_hub_cache(source):
            rows.append({"model": source, "measured": False,
                         "why": f"not in this machine's hub cache: run `bertlab download {source}` on a machine "
                                "with internet, then this script"})
            continue
        rows.append(score(source))
    result = {"meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                       "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(f"{r['model']}: " + (f"{r['hits']} of {r['total']} in its top {r['k']}" if r["measured"] else r["why"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
