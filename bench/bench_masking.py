"""The five masking schemes under one budget: token, whole_word, span, entity (ERNIE), phrase (noun phrases).

Each scheme pre-trains the same new tiny BERT (same seed: same initial weights, same documents, same pairs,
same steps, batch and learning rate; MLM only, no pair task, so the masking is the only difference) on
CoNLL-2003's training text (`--corpus conll2003`: train.txt, whose entity and chunk tags entity and phrase
masking read), once per seed. Each kept model is then scored on held-out text it never saw, CoNLL-2003's
dev.txt: top-1 accuracy at masked positions, the same seeded positions for every model, every chosen token
replaced by [MASK], under three ways of choosing them: single tokens (BERT's test), whole words, and whole
named entities (the dev file's own tags); top-1 accuracy and cross-entropy (nats per masked token). Mean and
spread (sample standard deviation, min and max) over the seeds. At this scale (a few hundred steps of a
2-layer model, which still guesses mostly the most frequent pieces) a gap whose seeds' ranges overlap is
inside the spread, and the docs say so.

Needs BERTLAB_DATA with conll2003/. Writes bench/results/masking_schemes.json.

    nice python bench/bench_masking.py [--steps 150] [--seeds 0 1 2] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "results" / "masking_schemes.json"
EVAL_SCHEMES = ("token", "whole_word", "entity")  # how the held-out positions are chosen


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def held_out_batches(tok, documents, seq_len: int, max_pairs: int):
    """The held-out examples (dev text as single sequences of `seq_len`, with their mention codes)."""
    from bertlab.training.pairs import build_pairs

    return build_pairs(documents, tok, task="nsp", max_seq_length=seq_len, seed=0, short_seq_prob=0.0)[:max_pairs]


def score(model, tok, examples, scheme: str, batch_size: int = 64) -> dict[str, float]:
    """Top-1 accuracy at the positions `scheme` chooses (15 %, seeded per example, all replaced by [MASK]);
    [UNK] targets are not scored."""
    import torch

    from bertlab.training.masking import IGNORE_INDEX, MaskingConfig, MLMCollator

    collate = MLMCollator(tok, MaskingConfig(strategy=scheme, mask_prob=1.0, random_prob=0.0), seed=1234,
                          static=True)
    right = n = 0
    loss = 0.0
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(examples), batch_size):
            batch = collate(examples[i : i + batch_size])
            picked = batch.labels != IGNORE_INDEX
            logits = model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                           mlm_positions=picked).mlm_logits
            targets = batch.labels[picked]
            scored = targets != tok.unk_token_id
            right += int(((logits.argmax(-1) == targets) & scored).sum())
            loss += float(torch.nn.functional.cross_entropy(logits.float()[scored], targets[scored], reduction="sum"))
            n += int(scored.sum())
    return {"accuracy": right / n, "loss": loss / n, "positions": n}


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether two schemes' ranges over the seeds overlap: their gap is inside the spread."""
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--schemes", nargs="+", default=None, help="default: every masking.STRATEGIES")
    p.add_argument("--eval-pairs", type=int, default=200, help="held-out sequences scored (default 200)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    from bertlab.loading import default_model_folder
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.corpora import load_corpus
    from bertlab.training.masking import STRATEGIES
    from bertlab.training.pretrain import PretrainConfig, pretrain

    schemes = a.schemes or list(STRATEGIES)
    load_start, t0 = _load(), time.time()
    tok = Tokenizer.from_folder(default_model_folder())
    train = load_corpus("conll2003", split="train")  # train.txt only: dev.txt is the held-out text
    held = held_out_batches(tok, load_corpus("conll2003", split="held_out"), a.seq, a.eval_pairs)
    runs = []
    for seed in a.seeds:
        for scheme in schemes:
            t = time.time()
            cfg = PretrainConfig(size="tiny", corpus="conll2003", steps=a.steps, batch_size=a.batch, seq_len=a.seq,
                                 lr=a.lr, masking=scheme, pair_task="none", seed=seed, device=a.device,
                                 precision="fp32", log_every=max(1, a.steps // 4))
            model, _, result = pretrain(cfg, tokenizer=tok, documents=train)
            if result.status != "completed":
                raise SystemExit(f"{scheme} seed {seed}: the run ended {result.status}: {result.error}")
            scores = {e: score(model.cpu(), tok, held, e) for e in EVAL_SCHEMES}
            runs.append({"scheme": scheme, "seed": seed, "seconds": round(time.time() - t, 1),
                         "train_mlm_loss": round(result.history[-1].get("mlm_loss", float("nan")), 4),
                         **{f"{e}_acc": round(s["accuracy"], 4) for e, s in scores.items()},
                         **{f"{e}_loss": round(s["loss"], 4) for e, s in scores.items()},
                         **{f"{e}_positions": s["positions"] for e, s in scores.items()}})
            print(json.dumps(runs[-1]), flush=True)
    rows = []
    for scheme in schemes:
        mine = [r for r in runs if r["scheme"] == scheme]
        rows.append({"scheme": scheme, **{f"{e}_{m}": spread([r[f"{e}_{m}"] for r in mine])
                                          for e in EVAL_SCHEMES for m in ("acc", "loss")}})
    base = next((r for r in rows if r["scheme"] == "token"), None)
    for r in rows:  # the comparisons the page states: each scheme against token masking, held-out tokens hidden
        if base is not None and r is not base:
            r["vs_token"] = {m: {"gap": round(r[f"token_{m}"]["mean"] - base[f"token_{m}"]["mean"], 4),
                                 "inside_spread": overlap(r[f"token_{m}"], base[f"token_{m}"])}
                             for m in ("acc", "loss")}
    data = {
        "meta": {"command": "python bench/bench_masking.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": a.threads,
                 "size": "tiny", "steps": a.steps, "batch": a.batch, "seq_len": a.seq, "lr": a.lr,
                 "seeds": a.seeds, "corpus": "CoNLL-2003 train.txt", "held_out": "CoNLL-2003 dev.txt",
                 "held_out_sequences": len(held), "pair_task": "none", "precision": "fp32", "device": a.device,
                 "wall_s": round(time.time() - t0, 1), "load_avg_start": load_start, "load_avg_end": _load()},
        "rows": rows,
        "runs": runs,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.out} in {data['meta']['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
