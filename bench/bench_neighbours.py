"""Corpus neighbours on the offline default: the index built over the first N sentences of the offline
Wikipedia corpus (tokens per second, seconds), then the time of one query (the nearest-k search, and the
whole `corpus_neighbours` call with the query sentence's forward pass) on an index of 500,000 tokens at the
last stage. Rows beyond the built ones are copies of the built rows (a query's cost depends only on the
number of rows and their width); the json says how many are real. Writes bench/results/neighbours.json.

    python bench/bench_neighbours.py [--sentences 2000] [--tokens 500000] [--repeats 11]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "neighbours.json"
AIM_S = 1.0


def main(argv: list[str] | None = None) -> int:
    from bertlab.analysis.neighbours import build_index, corpus_neighbours, nearest
    from bertlab.loading import load
    from bertlab.settings import DEFAULT_MODEL
    from bertlab.training.corpora import load_corpus

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    model, tok = load(None)
    stage = model.config.num_hidden_layers
    sentences = [s for d in load_corpus("wiki-offline", "train") for s in d.sentences][: args.sentences]
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        index = build_index(model, tok, sentences, stage, folder=Path(folder))
        build_s = time.perf_counter() - t0
    built = len(index)
    reps = -(-args.tokens // built)
    index.vectors = index.vectors.repeat(reps, 1)[: args.tokens]
    index.sentence_of = index.sentence_of.repeat(reps)[: args.tokens]
    index.position = index.position.repeat(reps)[: args.tokens]
    index.pieces = (index.pieces * reps)[: args.tokens]
    query = torch.randn(model.config.hidden_size)
    text = sentences[0]
    word = text.split()[1].strip(",.;:")
    search, whole = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        nearest(index, query, k=10)
        search.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        corpus_neighbours(model, tok, index, text, word, k=10)
        whole.append(time.perf_counter() - t0)
    out = {"model": DEFAULT_MODEL, "date": dt.date.today().isoformat(), "machine": platform.machine(),
           "threads": torch.get_num_threads(), "stage": stage, "corpus": "wiki-offline (train split)",
           "built_sentences": len(sentences), "built_tokens": built, "build_seconds": round(build_s, 1),
           "build_tokens_per_second": round(built / build_s), "index_tokens": len(index),
           "index_MiB": round(index.vectors.numel() * 2 / 2**20, 1),
           "rows_copied": len(index) - built, "query_search_s_median": round(statistics.median(search), 4),
           "query_whole_s_median": round(statistics.median(whole), 4), "repeats": args.repeats, "aim_s": AIM_S,
           "note": "shared CPU; rows beyond built_tokens are copies of the built rows"}
    print(json.dumps(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
