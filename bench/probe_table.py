"""Probe accuracy per layer for the offline default: part of speech, chunk and named entities (CoNLL-2003:
fit on the first N train sentences, scored on the first M dev sentences), UPOS and dependency relations
(UD EWT dev file split by sentence: every 5th sentence scores), each with its control task and selectivity
and a scalar mix; the structural probe's UUAS and distance Spearman. Nothing is chosen on the scored data
(fixed settings: bertlab.analysis.probes / structural defaults). Writes bench/results/probes.json.

    python bench/probe_table.py [--train 500] [--eval 300]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "probes.json"


def main(argv: list[str] | None = None) -> int:
    from bertlab.analysis.probe_data import read_conll2003, read_conllu, split_sentences
    from bertlab.analysis.probes import probe_property
    from bertlab.analysis.structural import probe_tree
    from bertlab.loading import load
    from bertlab.settings import DEFAULT_MODEL, data_path

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--train", type=int, default=500, help="training sentences per property")
    p.add_argument("--eval", type=int, default=300, help="scored sentences per property")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--properties", default="pos,chunk,ner,upos,deprel,tree")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model, tok = load(None)
    conll = (read_conll2003(data_path("conll2003", "train.txt"))[: args.train],
             read_conll2003(data_path("conll2003", "dev.txt"))[: args.eval])
    ud_train, ud_eval = split_sentences(read_conllu(data_path("ud_ewt", "en_ewt-ud-dev.conllu")))
    ud = ud_train[: args.train], ud_eval[: args.eval]
    rows = {}
    for prop in args.properties.split(","):
        t0 = time.perf_counter()
        train, ev = ud if prop in ("upos", "deprel", "tree") else conll
        result = probe_tree(model, tok, train, ev) if prop == "tree" else probe_property(model, tok, train, ev, prop)
        rows[prop] = {**result.as_json(), "seconds": round(time.perf_counter() - t0, 1),
                      "data": ("UD EWT dev file split by sentence (every 5th scores)" if prop in
                               ("upos", "deprel", "tree") else "CoNLL-2003 train (fit) / dev (scored)")}
        print(json.dumps({k: rows[prop][k] for k in ("property", "accuracy", "seconds")}), flush=True)
    out = {"model": DEFAULT_MODEL, "word_feature": "first piece", "date": dt.date.today().isoformat(),
           "machine": platform.machine(), "threads": torch.get_num_threads(),
           "note": f"modest subset on a shared CPU: at most {args.train} training and {args.eval} scored sentences "
                   "per property (counts per row)", "properties": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
