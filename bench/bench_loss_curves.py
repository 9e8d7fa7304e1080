"""Loss curves of a real short fine-tune with the encoder packing the real tokens (what training does) against
the padded path, next to the run-to-run noise of the padded path itself.

The offline default (all-MiniLM-L6-v2) with one fresh SST-2 head (the same start weights in every run) trains
`--steps` steps on the same SST-2 batches (`BucketBatchSampler` with one seed: the same sentences in the same
batches, in the same order, for every run), with the lab's loss (`training.finetune.sequence_loss`) and loop
(`training.loop.train`: the SST-2 recipe's learning rate and warm-up, AdamW, clipping at 1.0), in fp32. Runs, for
each of `--seeds` dropout seeds (`--seed`, `--seed` + 1, ...):

  padded-s<i>    `model.bert.packing = False`
  packed-s<i>    packing on (the default), the same dropout seed

Packed and padded draw dropout masks over tensors of different shapes ([tokens, d] against [batch, seq, d]),
so their masks differ as two seeds' do: the run-to-run noise of one path is the gap between two of its runs
with different seeds (every pair of seeds, on each path), and the packed-padded gaps (every packed run against
every padded run) are set against it. Reported: the per-step losses, the mean absolute gap between two runs'
losses (per step and on a moving average of `--window` steps), the last window's mean loss and the held-out
accuracy on `--dev` sentences of SST-2's dev file.

The verdict is a permutation test (`exchangeability`): if packing changes nothing, the 2 x `--seeds` runs are
exchangeable, so the packed-padded split should not stand out among all splits of the runs into two equal groups
by its mean cross-group moving-average gap minus its mean within-group gap. "Agree" when p >= 0.05, "differ"
when p < 0.05, and "too few seeds to tell" when even the most extreme split could not reach 0.05 (3 seeds give
10 splits, smallest p 0.1: use 4 or more). Also kept, as a description: the median packed-padded gap over the
largest seed-to-seed gap of one path (`gap_over_noise`), a median set against a maximum, with no error rate.
Writes bench/results/loss_curves.json.

    BERTLAB_DATA=../shared/data python bench/bench_loss_curves.py [--steps 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import statistics
import time
from pathlib import Path

import torch
from turns import load_average, meta

ALPHA = 0.05  # the permutation test's level: a packed-padded gap this unlikely under "no difference" is a difference


def moving_average(xs: list[float], window: int) -> list[float]:
    """Means of each `window` consecutive values (len(xs) - window + 1 of them)."""
    return [sum(xs[i:i + window]) / window for i in range(len(xs) - window + 1)]


def mean_gap(a: list[float], b: list[float]) -> float:
    """Mean absolute difference of two curves of the same length."""
    if len(a) != len(b) or not a:
        raise ValueError(f"curves of different lengths ({len(a)} and {len(b)}) cannot be compared.")
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def compare(rows: dict[str, dict], window: int) -> dict[str, dict]:
    """Gaps between every two runs (`rows`: name -> {"packing", "losses", "dev_accuracy"}), grouped as
    "padded vs padded", "packed vs packed" (the seed-to-seed noise of each path) and "padded vs packed"
    (each: pairs, per-step and moving-average gaps, dev accuracy differences)."""
    groups: dict[str, dict] = {}
    names = list(rows)
    for i, one in enumerate(names):
        for other in names[i + 1:]:
            first, second = (other, one) if rows[one]["packing"] and not rows[other]["packing"] else (one, other)
            a, b = rows[first], rows[second]  # the padded run first when the two differ
            kind = {(False, False): "padded vs padded", (True, True): "packed vs packed"}.get(
                (a["packing"], b["packing"]), "padded vs packed")
            g = groups.setdefault(kind, {"pairs": [], "per_step": [], "moving_average": [], "dev_accuracy": []})
            g["pairs"].append(f"{first} vs {second}")
            g["per_step"].append(round(mean_gap(a["losses"], b["losses"]), 4))
            g["moving_average"].append(round(mean_gap(moving_average(a["losses"], window),
                                                      moving_average(b["losses"], window)), 4))
            g["dev_accuracy"].append(round(b["dev_accuracy"] - a["dev_accuracy"], 4))
    return groups


def agree_within_noise(groups: dict[str, dict]) -> tuple[bool, float]:
    """(whether the median packed-padded moving-average gap is within the largest seed-to-seed gap of one
    path, their ratio). Needs two seeds or more: with one there is no noise to compare with."""
    noise = [g for kind in ("padded vs padded", "packed vs packed")
             for g in groups.get(kind, {}).get("moving_average", [])]
    if not noise:
        raise ValueError("give --seeds 2 or more: the seed-to-seed noise needs two runs of one path.")
    cross = statistics.median(groups["padded vs packed"]["moving_average"])
    return cross <= max(noise), round(cross / max(noise), 3)


def exchangeability(rows: dict[str, dict], window: int) -> dict:
    """A permutation test of "packing changes nothing": then the runs of both paths are exchangeable, and the mean
    moving-average gap between the two paths' runs is no larger than under any other split of the runs into two
    equal groups. Returns the observed statistic (mean cross-group gap - mean within-group gap), its p-value over
    every split (the observed one included), how many splits there are, and the smallest p-value they allow."""
    names = sorted(rows)
    packed = frozenset(n for n in names if rows[n]["packing"])
    if len(packed) != len(names) - len(packed) or len(packed) < 2:
        raise ValueError("the test needs as many packed runs as padded runs, two or more of each (--seeds 2+).")
    curves = {n: moving_average(rows[n]["losses"], window) for n in names}
    gap = {(a, b): mean_gap(curves[a], curves[b]) for i, a in enumerate(names) for b in names[i + 1:]}

    def statistic(group: frozenset) -> float:
        cross = [g for (a, b), g in gap.items() if (a in group) != (b in group)]
        within = [g for (a, b), g in gap.items() if (a in group) == (b in group)]
        return statistics.mean(cross) - statistics.mean(within)

    # every split once: the group holding the first name, with k - 1 of the others
    splits = [frozenset((names[0], *rest)) for rest in itertools.combinations(names[1:], len(packed) - 1)]
    observed = statistic(packed)
    at_least = sum(statistic(s) >= observed - 1e-12 for s in splits)
    return {"statistic": round(observed, 5), "p_value": round(at_least / len(splits), 4), "splits": len(splits),
            "smallest_p": round(1 / len(splits), 4)}


def verdict(test: dict, alpha: float = ALPHA) -> bool | None:
    """True: packed and padded agree within the seed-to-seed noise (p >= alpha); False: they differ (p < alpha);
    None: too few seeds for the test to tell (even the most extreme split would give p >= alpha)."""
    if test["smallest_p"] >= alpha:
        return None
    return test["p_value"] >= alpha


def main() -> None:
    from bertlab.loading import load
    from bertlab.tasks import SST2_LABELS, BucketBatchSampler, collate, featurize_classification, get_task, read_sst2
    from bertlab.training.finetune import evaluate, sequence_loss, with_task_head
    from bertlab.training.finetune_defaults import recipe
    from bertlab.training.loop import TrainConfig, train

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dev", type=int, default=1000, help="held-out sentences (the first of SST-2's dev file)")
    p.add_argument("--window", type=int, default=20, help="steps in the moving average")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=5, help="dropout seeds per path (4 or more for the test to tell)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "loss_curves.json"))
    p.add_argument("--rescore", metavar="FILE", help="no training: decide again on the runs of a results file "
                                                     "(its curves, window and meta kept) and write --out")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if a.rescore:
        earlier = json.loads(Path(a.rescore).read_text())
        write(earlier["runs"], {**earlier["meta"], "rescored": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              Path(a.out))
        return
    load_start, t_start = load_average(), time.perf_counter()
    rec = recipe("sst2", "full")
    base, tok = load()
    torch.manual_seed(a.seed)
    start = with_task_head(base, get_task("sst2"), SST2_LABELS)  # the same fresh head for every run
    train_examples = read_sst2("train")
    order = torch.randperm(len(train_examples), generator=torch.Generator().manual_seed(a.seed)).tolist()
    feats = featurize_classification([train_examples[i] for i in order[:a.steps * a.batch]], tok, rec.max_length)
    dev = read_sst2("dev")[:a.dev]
    if a.seeds < 2:
        p.error("--seeds: give 2 or more (the seed-to-seed noise needs two runs of one path).")
    runs = {f"{path}-s{i + 1}": (path == "packed", a.seed + i) for i in range(a.seeds) for path in ("padded", "packed")}
    torch.set_num_threads(a.threads)
    rows = {}
    for name, (packing, seed) in runs.items():
        model = copy.deepcopy(start)
        model.bert.packing = packing
        losses: list[torch.Tensor] = []

        def loss_fn(m: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
            loss, metrics = sequence_loss(m, batch)
            losses.append(loss.detach())
            return loss, metrics

        sampler = BucketBatchSampler([len(f) for f in feats], a.batch, seed=a.seed)
        cfg = TrainConfig(lr=rec.lr, max_steps=a.steps, epochs=1, batch_size=a.batch, seed=seed, device="cpu",
                          precision="fp32", warmup_ratio=rec.warmup_ratio, max_grad_norm=1.0, log_every=a.steps)
        t = time.perf_counter()
        train(model, loss_fn, feats, cfg, collate=lambda fs: collate(fs, tok.pad_token_id),
              batch_sampler=sampler).raise_for_status()
        train_s = time.perf_counter() - t
        model.eval()
        acc = evaluate(model, tok, "sst2", dev)["accuracy"]
        curve = [round(float(x), 5) for x in losses]
        rows[name] = {"packing": packing, "dropout_seed": seed, "losses": curve,
                      "last_window_loss": round(sum(curve[-a.window:]) / a.window, 4),
                      "dev_accuracy": round(acc, 4), "train_s": round(train_s, 1)}
        print(f"{name}: last {a.window} steps' loss {rows[name]['last_window_loss']}, dev accuracy {acc:.4f}",
              flush=True)
    write(rows, {**meta(a.threads, a.steps, load_start), "model": "offline default (all-MiniLM-L6-v2)",
                 "task": "sst2", "batch": a.batch, "lr": rec.lr, "warmup_ratio": rec.warmup_ratio,
                 "precision": "fp32", "dev_sentences": len(dev), "window": a.window, "seeds": a.seeds,
                 "wall_s": round(time.perf_counter() - t_start, 1),
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, Path(a.out))


def write(rows: dict[str, dict], run_meta: dict, out_path: Path) -> None:
    """The gaps, the permutation test and the verdict of `rows` (name -> run), printed and written to `out_path`."""
    gaps = compare(rows, run_meta["window"])
    _, ratio = agree_within_noise(gaps)
    test = exchangeability(rows, run_meta["window"])
    agree = verdict(test)
    out = {"meta": run_meta, "gaps": gaps, "permutation_test": test, "agree_within_noise": agree,
           "gap_over_noise": ratio, "runs": rows}
    for k, v in gaps.items():
        print(k, v)
    print(f"permutation test: p = {test['p_value']} over {test['splits']} splits (smallest possible "
          f"{test['smallest_p']}); packed and padded agree within the seed-to-seed noise:",
          {True: "yes", False: "no", None: "too few seeds to tell"}[agree])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {out_path}")


if __name__ == "__main__":
    main()
