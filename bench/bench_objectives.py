"""The family's pre-training objectives compared under one budget, then fine-tuned on SST-2 the same way.

Every objective (bertlab.training.objectives: bert, roberta, albert, electra, spanbert) pre-trains a new
model of the same size, from the same seed, on the same documents, for the same number of steps, batch
size and sequence length. Its curves are recorded (its own loss, MLM accuracy on the training batches,
and a probe sentence's P(target) under its masked-word predictor: ELECTRA's is its small generator),
then held-out MLM top-1 (every 20th document of the corpus, never trained on). Each kept model (ELECTRA:
the discriminator) is then fine-tuned on the same SST-2 training sentences (SST2_SETTINGS: 3 epochs at
3e-4) and scored on SST-2 dev sentences it never trained on, and probed: its frozen mean-pooled
last-layer features -> logistic regression fitted to convergence on the same training sentences, scored
on the same dev sentences (compare.sst2_probe). A model with no pre-training at all (random weights,
BERT's shape) is fine-tuned and probed the same way as the floor.

    python bench/bench_objectives.py [--steps 200] [--size mini] [--seq-len 64] [--batch 16] [--quick]

Writes bench/results/objectives.json (and, when kaleido can draw, objectives.png); docs/results.md's
`figures:objectives` block comes from it (bench/readme_tables.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bertlab.loading import default_model_folder  # noqa: E402
from bertlab.settings import data_dir  # noqa: E402
from bertlab.tasks import get_task  # noqa: E402
from bertlab.tasks.splits import subset  # noqa: E402
from bertlab.tokenizer import Tokenizer  # noqa: E402
from bertlab.training.corpora import load_corpus  # noqa: E402
from bertlab.training.objectives import OBJECTIVES, get_objective  # noqa: E402
from bertlab.training.objectives.compare import (  # noqa: E402
    PROBE_SETTINGS,
    SST2_SETTINGS,
    CurveRecorder,
    sst2_probe,
    sst2_score,
)
from bertlab.training.pretrain import (  # noqa: E402
    PretrainConfig,
    evaluate_objective,
    objective_module,
    pretrain_objective,
)

RESULTS = ROOT / "bench" / "results"
BERT_BASE_TOKENS = 1_000_000 * 256 * 512  # BERT-base: 1M steps of 256 sequences of 512 tokens (the paper's budget)
log = logging.getLogger("bench_objectives")


def documents_for(corpus: str, tokens_needed: int, seed: int) -> list:
    """Seeded shuffle of the corpus's training documents, as many as hold ~1.5x the tokens the run reads."""
    docs = load_corpus(corpus, split="train")
    random.Random(seed).shuffle(docs)
    out, tokens = [], 0
    for d in docs:
        out.append(d)
        tokens += int(1.3 * d.num_words)
        if tokens >= 1.5 * tokens_needed and len(out) >= 200:
            break
    return out


def majority_share(examples: list) -> float:
    """The share of the most frequent label: what a model that always says it scores."""
    positive = sum(e.label for e in examples) / len(examples)
    return max(positive, 1 - positive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="*", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--size", default="mini")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--corpus", default="ovos-wiki")
    parser.add_argument("--sst2-train", type=int, default=3000, help="SST-2 training sentences (from train.tsv)")
    parser.add_argument("--sst2-dev", type=int, default=1000, help="SST-2 sentences scored (from dev.tsv)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny size, 6 steps, 64/64 sentences")
    parser.add_argument("--out", type=Path, default=RESULTS / "objectives.json")
    parser.add_argument("--no-png", action="store_true", help="do not draw objectives.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.steps, args.sst2_train, args.sst2_dev = "tiny", 6, 64, 64
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_folder(default_model_folder())
    tokens_per_run = args.steps * args.batch * args.seq_len
    docs = documents_for(args.corpus, tokens_per_run, args.seed)
    held = load_corpus(args.corpus, split="held_out")[:50]
    sst2 = get_task("sst2")
    sst2_dir = data_dir() / "sst2"
    train_ex = subset(sst2.read("train", path=sst2_dir), args.sst2_train, args.seed, "train")
    dev_ex = subset(sst2.read("dev", path=sst2_dir), args.sst2_dev, args.seed, "dev")
    overlap = {(e.text_a, e.text_b) for e in train_ex} & {(e.text_a, e.text_b) for e in dev_ex}
    work = Path(tempfile.mkdtemp(prefix="bench-objectives-"))
    rows, curves = [], {}
    load_before = os.getloadavg()
    for name in args.objectives:
        objective = get_objective(name)
        cfg = PretrainConfig(objective=name, size=args.size, steps=args.steps, seq_len=args.seq_len,
                             batch_size=args.batch, lr=args.lr, log_every=max(1, args.steps // 40), seed=args.seed,
                             device="cpu")
        torch.manual_seed(args.seed)
        module = objective_module(objective, cfg, tok)
        recorder = CurveRecorder(module, objective, tok)
        t0 = time.perf_counter()
        run = pretrain_objective(cfg, tokenizer=tok, documents=docs, callbacks=[recorder], module=module)
        run.result.raise_for_status()
        pretrain_s = time.perf_counter() - t0
        held_out = evaluate_objective(module, objective, tok, held, cfg)
        folder = run.save(work / name)
        score = sst2_score(folder, train_ex, dev_ex, seed=args.seed)
        probe = sst2_probe(folder, train_ex, dev_ex)
        last = next(p for p in reversed(recorder.points) if p.own_loss is not None)
        kept = run.kept
        rows.append({
            "objective": name, "title": objective.title, "hf_class": objective.hf_class,
            "kept_params_m": round(sum(p.numel() for p in kept.parameters()) / 1e6, 2),
            "trained_params_m": round(sum(p.numel() for p in module.parameters()) / 1e6, 2),
            "pretrain_s": round(pretrain_s, 1), "own_loss_name": objective.own_loss,
            "own_loss_first": next(p.own_loss for p in recorder.points if p.own_loss is not None),
            "own_loss_last": last.own_loss, "mlm_acc_last": last.mlm_acc, "probe_p_last": last.probe_p,
            "held_out": held_out, "sst2": score, "probe": probe,
        })
        curves[name] = recorder.as_dicts()
        log.info("%s: %.0f s, %s, SST-2 fine-tuned %.3f, probe %.3f", name, pretrain_s, held_out,
                 score["accuracy"], probe["accuracy"])
    # the floor: the same fine-tuning on a model that never pre-trained (BERT's shape, random weights)
    torch.manual_seed(args.seed)
    floor = get_objective("bert").build(PretrainConfig(size=args.size).shape(), tok)
    get_objective("bert").save(floor.eval(), tok, work / "random-init")
    floor_score = sst2_score(work / "random-init", train_ex, dev_ex, seed=args.seed)
    floor_probe = sst2_probe(work / "random-init", train_ex, dev_ex)
    log.info("random init: SST-2 fine-tuned %.3f, probe %.3f", floor_score["accuracy"], floor_probe["accuracy"])
    meta = {
        "size": args.size, "steps": args.steps, "seq_len": args.seq_len, "batch": args.batch, "lr": args.lr,
        "corpus": args.corpus, "documents": len(docs), "tokens_per_run": tokens_per_run,
        "bert_base_tokens": BERT_BASE_TOKENS, "sst2": {"train": len(train_ex), "dev": len(dev_ex),
                                                        "dev_majority": majority_share(dev_ex),
                                                        "exact_overlap": len(overlap), **SST2_SETTINGS},
        "probe": {"features": "mean-pooled last layer, frozen", "fit": "logistic regression, full-batch L-BFGS "
                  "from zero on standardised features", **PROBE_SETTINGS},
        "threads": args.threads, "device": "cpu", "cpus": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
        "command": "python bench/bench_objectives.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = {"meta": meta, "rows": rows, "random_init": {"sst2": floor_score, "probe": floor_probe}, "curves": curves}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    if not args.no_png:
        _draw(curves, args.out.with_suffix(".png"), meta)
    return 0


def _draw(curves: dict, path: Path, meta: dict) -> None:
    """The curves as a PNG when kaleido can draw (it needs a Chromium); skipped otherwise."""
    from bertlab.viz.objectives import plot_objective_curves

    fig = plot_objective_curves(curves, title=f"{meta['size']} models, {meta['steps']} steps of {meta['batch']} x "
                                              f"{meta['seq_len']} tokens, {meta['corpus']}")
    try:
        fig.write_image(str(path), scale=1)
        print(f"wrote {path}")
    except Exception as e:  # noqa: BLE001 - a picture is optional; the JSON holds the curves
        print(f"no PNG ({type(e).__name__}: {str(e)[:120]})")


if __name__ == "__main__":
    sys.exit(main())
