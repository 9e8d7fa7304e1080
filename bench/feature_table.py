"""The BERT paper's feature table (its Table 7) for bertlab's model on CoNLL-2003 NER: six rows of frozen
features (`bertlab finetune --task ner --mode feature --features X`: embeddings, last, second-to-last,
sum-last-4, concat-last-4, mix) and the fine-tuning row (`bertlab finetune --task ner`), all on the same
seeded train subset and scored on the same dev sentences. Writes bench/results/feature_table.json and, unless
--no-readme, the docs block `figures:feature-table` of docs/benchmarks.md (bench/render.py).

The head on the features is linear for every row (the paper: a two-layer BiLSTM). Its lr and epochs are
chosen first on the train subset alone (fit on 80 %, scored on the other 20 %; `head_choice` in the file),
never on the dev sentences the table reports. The fine-tuning row takes the task's defaults.

    BERTLAB_DATA=../shared/data OMP_NUM_THREADS=2 python bench/feature_table.py            # ~15 min on 2 cores
    python bench/feature_table.py --train 2000 --dev 0 --model default-encoder --out FILE   # 0 = every dev sentence
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "feature_table.json"
HEAD_CHOICES = ((1e-3, 10), (1e-2, 10), (1e-2, 30), (3e-2, 10), (3e-2, 30))  # (lr, epochs), tried on train alone
CHOOSE_ON = ("last", "mix")  # the rows whose mean held-out F1 picks the head's settings


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _run(cfg: Any, tok: Any, train: list, dev: list) -> tuple[Any, float]:
    from bertlab.training.feature_head import run_finetune

    t0 = time.perf_counter()
    result = run_finetune(cfg, tokenizer=tok, train_examples=train, eval_examples=dev)
    result.train.raise_for_status()
    return result, time.perf_counter() - t0


def choose_head(model: Any, tok: Any, train: list, seed: int, batch: int) -> dict[str, Any]:
    """(lr, epochs) of the linear head with the best mean F1 over CHOOSE_ON, fitted on 80 % of `train` and
    scored on its other 20 % (a seeded split of the train subset: the dev set is not read)."""
    import torch

    from bertlab.training.finetune import FinetuneConfig

    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    cut = len(train) * 4 // 5
    fit, held = [train[i] for i in sorted(order[:cut])], [train[i] for i in sorted(order[cut:])]
    tried = []
    for lr, epochs in HEAD_CHOICES:
        scores = {}
        for features in CHOOSE_ON:
            cfg = FinetuneConfig(task="ner", mode="feature", features=features, model=model, lr=lr, epochs=epochs,
                                 batch_size=batch, seed=seed, device="cpu")
            result, _ = _run(cfg, tok, fit, held)
            scores[features] = round(result.score, 4)
        mean = round(sum(scores.values()) / len(scores), 4)
        tried.append({"lr": lr, "epochs": epochs, "f1": scores, "mean_f1": mean})
        print(json.dumps(tried[-1]), flush=True)
    best = max(tried, key=lambda t: t["mean_f1"])
    return {"lr": best["lr"], "epochs": best["epochs"], "tried": tried, "fit_sentences": len(fit),
            "held_out_sentences": len(held),
            "basis": f"fit on {len(fit):,} of the train subset's sentences, scored on the other {len(held):,} "
                     f"(rows {', '.join(CHOOSE_ON)}; the dev sentences are not read)"}


def _row(name: str, result: Any, seconds: float, load_start: list[float], epochs: int, lr: float) -> dict[str, Any]:
    m = result.metrics
    row = {
        "name": name, "features": getattr(result, "features", None), "mode": result.mode,
        "head": result.summary().get("head", "the model's own token classifier (all weights learn)"),
        "dev_f1": round(result.score, 4), "precision": round(m["precision"], 4), "recall": round(m["recall"], 4),
        "train_sentences": result.train_examples, "dev_sentences": result.eval_examples,
        "epochs": epochs, "lr": lr, "seconds": round(seconds, 2), "device": result.device,
        "precision_mode": result.precision, "load_avg_start": load_start, "load_avg_end": _load(),
    }
    if getattr(result, "mix", None):
        row["mix"] = result.mix
    if hasattr(result, "features_s"):
        row["features_s"] = round(result.features_s, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=2000, help="train sentences (a seeded subset; default %(default)s)")
    p.add_argument("--dev", type=int, default=0, help="dev sentences scored (a seeded subset; 0 = all)")
    p.add_argument("--model", default=None, help="a bertlab.load source (default: the ner task's start)")
    p.add_argument("--data", default=None, help="a CoNLL-2003 folder (default: BERTLAB_DATA/conll2003)")
    p.add_argument("--rows", default=None, help="comma-separated feature rows (default: all six) ")
    p.add_argument("--no-finetune", action="store_true", help="leave out the fine-tuning row")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-readme", action="store_true", help="do not rewrite the docs' table")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    from bertlab.loading import load
    from bertlab.tasks import get_task, subset
    from bertlab.tasks.layer_features import FEATURES
    from bertlab.training.feature_head import HEAD
    from bertlab.training.finetune import FinetuneConfig
    from bertlab.training.finetune_defaults import recipe

    t_all, load_before = time.perf_counter(), _load()
    task, feature_recipe, full_recipe = get_task("ner"), recipe("ner", "feature"), recipe("ner", "full")
    source = args.model if args.model is not None else feature_recipe.model
    model, tok = load(source)
    train = subset(task.read("train", path=args.data), args.train, args.seed, "train")
    dev = subset(task.read("dev", path=args.data), args.dev or None, args.seed, "dev")
    rows_wanted = args.rows.split(",") if args.rows else list(FEATURES)
    batch = feature_recipe.batch_size
    with tempfile.TemporaryDirectory(prefix="bertlab-feature-table-") as cache:
        os.environ["BERTLAB_CACHE"] = cache  # features computed afresh in this run, then read from here
        choice = choose_head(model, tok, train, args.seed, batch)
        rows = []
        for features in rows_wanted:
            start = _load()
            cfg = FinetuneConfig(task="ner", mode="feature", features=features, model=model, lr=choice["lr"],
                                 epochs=choice["epochs"], batch_size=batch, seed=args.seed, device="cpu")
            result, seconds = _run(cfg, tok, train, dev)
            rows.append(_row(features, result, seconds, start, choice["epochs"], choice["lr"]))
            print(json.dumps({k: rows[-1][k] for k in ("name", "dev_f1", "seconds")}), flush=True)
    if not args.no_finetune:
        start = _load()
        cfg = FinetuneConfig(task="ner", mode="full", model=model, seed=args.seed, device="cpu")  # a copy learns
        result, seconds = _run(cfg, tok, train, dev)
        rows.append(_row("fine-tuning", result, seconds, start, full_recipe.epochs, full_recipe.lr))
        print(json.dumps({k: rows[-1][k] for k in ("name", "dev_f1", "seconds")}), flush=True)
    out = {
        "model": str(source), "model_text": model.describe(), "head": HEAD, "word_feature": "first piece",
        "data": "CoNLL-2003 (BERTLAB_DATA/conll2003): a seeded train subset (fit), dev sentences (scored)",
        "train_sentences": len(train), "dev_sentences": len(dev), "seed": args.seed, "head_choice": choice,
        "rows": rows, "seconds": round(time.perf_counter() - t_all, 1), "threads": torch.get_num_threads(),
        "cores": os.cpu_count(), "machine": platform.machine(), "load_avg_before": load_before,
        "load_avg_after": _load(), "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "command": " ".join(["python bench/feature_table.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    if not args.no_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        import render

        render.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
