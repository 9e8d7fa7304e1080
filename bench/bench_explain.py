"""Attributions on the offline default: bertlab's integrated gradients against Captum's, same model,
same inputs, same baseline, same path points, one thread.

For each input (a masked word and a sentence pair, 32 tokens each): bertlab's `attribute` at its
default (midpoint rule, 16 points, cut in three until the completeness gap is under 1 %) and gradient ×
input; Captum's `IntegratedGradients` (riemann_middle, the same number of points, all in one batch, with
its convergence delta, i.e. the completeness check bertlab reports too)
on a function that puts the word embeddings into the same model through the same hook point (or, when
captum is not installed, a plain autograd loop, one point at a time). Also the largest difference
between the two attributions (a cross-check), the completeness gap at the default on more inputs,
and the no-gradient forward pass with and without the (empty) hook context, to show the hooks cost
nothing there. The variants take turns call by call; medians. Writes bench/results/explain.json.

    python bench/bench_explain.py [--repeats 7] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "explain.json"
AIM_S = 1.0
AIM_GAP = 0.01
MASK_TEXT = ("In 1969 the first men walked on the {mask}, watched by millions of people on television around "
             "the world, which was a historic moment for us all.")
PAIR = ("She opened the door and looked into the dark hall for a while.",
        "The stock market fell sharply on Monday after the news from the big bank.")


def _time_all(fns: dict, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of each fn(), wall clock and this process's CPU time (with one thread, what the wall
    clock reads on an idle machine; steadier when others share the cores); one warm-up call each,
    variants in turns (rotating order)."""
    for fn in fns.values():
        fn()
    names = list(fns)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t, c = time.perf_counter(), time.process_time()
            fns[n]()
            wall[n].append(time.perf_counter() - t)
            cpu[n].append(time.process_time() - c)
    return ({n: statistics.median(v) for n, v in wall.items()}, {n: statistics.median(v) for n, v in cpu.items()})


def _embedding_forward(model, ex, target):
    """f(word embeddings [n, seq, d]) -> probabilities [n], through the model's `hook_word` hook point."""
    hook = model.family.embedding_part_hook("hook_word")

    def forward(emb: torch.Tensor) -> torch.Tensor:
        n, seq = emb.shape[:2]
        where = torch.zeros(n, seq, dtype=torch.bool)
        if target.kind == "mlm":
            where[:, target.position] = True
        with model.hooks([(hook, lambda _x, _name: emb)]):
            out = model(ex.input_ids.expand(n, -1), token_type_ids=ex.token_type_ids.expand(n, -1),
                        mlm_positions=where)
        return target.probability(out)

    return forward


def _peer(forward, x: torch.Tensor, base: torch.Tensor, steps: int):
    """Captum's IntegratedGradients (riemann_middle, one batch, with its convergence delta) or,
    without captum, a plain loop."""
    try:
        from captum.attr import IntegratedGradients
    except ImportError:
        IntegratedGradients = None
    if IntegratedGradients is not None:
        ig = IntegratedGradients(forward)

        def run():  # with its convergence delta: the completeness gap bertlab reports too
            attr, _delta = ig.attribute(x[None], baselines=base[None], n_steps=steps, method="riemann_middle",
                                        internal_batch_size=steps, return_convergence_delta=True)
            return attr[0].sum(-1)

        return "captum IntegratedGradients", run

    def loop():
        total = torch.zeros_like(x)
        for i in range(steps):
            point = (base + (i + 0.5) / steps * (x - base)).detach().requires_grad_()
            (g,) = torch.autograd.grad(forward(point[None]).sum(), point)
            total += g / steps
        return (total * (x - base)).sum(-1)

    return "plain autograd loop", loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats, fewer gap inputs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    torch.set_num_threads(args.threads)

    from bertlab.analysis.attribution import attribute, baseline_ids
    from bertlab.analysis.targets import mask_target, pair_target
    from bertlab.loading import load
    from bertlab.recipes.default_heads import EVERYDAY_PAIRS

    model, tok = load(None)
    model.eval()
    words = model.family.embeddings(model).word_embeddings
    cases = {"masked word": mask_target(model, tok, MASK_TEXT.format(mask=tok.mask_token)),
             "sentence pair (IsNext)": pair_target(model, tok, *PAIR)}
    rows = []
    for name, (ex, target) in cases.items():
        ours = attribute(model, tok, ex, target)  # default steps (auto)
        steps = ours.steps
        with torch.no_grad():
            x = words(ex.input_ids)[0]
            base = words(baseline_ids(model, tok, ex, "pad"))[0]
        peer_name, peer = _peer(_embedding_forward(model, ex, target), x, base, steps)
        diff = float((peer().detach().double() - torch.tensor(ours.scores, dtype=torch.float64)).abs().max())
        times, cpu = _time_all({
            "ig": lambda ex=ex, target=target: attribute(model, tok, ex, target),
            "peer": peer,
            "gxi": lambda ex=ex, target=target: attribute(model, tok, ex, target, method="grad-x-input"),
        }, repeats)
        rows.append({
            "input": name, "tokens": len(ex), "target": target.name, "steps": steps,
            "completeness_gap": ours.completeness_gap, "bertlab_ig_s": times["ig"], "peer_s": times["peer"],
            "ratio_vs_peer": times["ig"] / times["peer"], "grad_x_input_s": times["gxi"],
            "bertlab_ig_cpu_s": cpu["ig"], "peer_cpu_s": cpu["peer"], "grad_x_input_cpu_s": cpu["gxi"],
            "cpu_ratio_vs_peer": cpu["ig"] / cpu["peer"],
            "max_abs_diff_vs_peer": diff, "peer": peer_name,
        })
        print(f"{name}: {len(ex)} tokens, {steps} steps, gap {100 * ours.completeness_gap:.3f}%, bertlab IG "
              f"{times['ig']:.3f} s (CPU {cpu['ig']:.3f} s), {peer_name} {times['peer']:.3f} s "
              f"(CPU {cpu['peer']:.3f} s), "
              f"ratio {times['ig'] / times['peer']:.2f} (CPU {cpu['ig'] / cpu['peer']:.2f}), grad x input "
              f"{times['gxi']:.3f} s, max |diff| {diff:.2e}")

    gap_inputs = [pair_target(model, tok, a, b) for a, b, *_ in EVERYDAY_PAIRS[: 4 if args.quick else None]]
    gap_inputs += [mask_target(model, tok, t.format(mask=tok.mask_token)) for t in (
        "The man went to the {mask} store to buy a gallon of milk.", "Paris is the capital of {mask}.",
        "He bought a gallon {mask} milk.", "My dog is {mask}.")]
    gaps = [attribute(model, tok, ex, target) for ex, target in gap_inputs]
    worst = max(gaps, key=lambda a: a.completeness_gap)

    ex, _ = cases["masked word"]
    def plain():
        return model(ex.input_ids)

    def with_context():
        with model.hooks([], bwd_hooks=[]):
            return model(ex.input_ids)

    with torch.inference_mode():
        fwd, fwd_cpu = _time_all({"plain": plain, "hooks": with_context}, max(repeats, 5) * 8)

    result = {
        "meta": {"threads": args.threads, "repeats": repeats, "torch": torch.__version__,
                 "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "python": platform.python_version(), "peer": rows[0]["peer"], "captum": _captum_version()},
        "rows": rows,
        "gaps": {"inputs": len(gaps), "max_gap": worst.completeness_gap, "max_gap_target": worst.target.name,
                 "steps": sorted({a.steps for a in gaps}), "aim": AIM_GAP},
        "forward_no_grad": {"plain_ms": 1000 * fwd["plain"], "in_empty_hook_context_ms": 1000 * fwd["hooks"],
                            "plain_cpu_ms": 1000 * fwd_cpu["plain"],
                            "in_empty_hook_context_cpu_ms": 1000 * fwd_cpu["hooks"],
                            "ratio": fwd_cpu["hooks"] / fwd_cpu["plain"]},  # CPU time: steadier under load
        "summary": {"aim_s": AIM_S, "worst_ig_s": max(r["bertlab_ig_s"] for r in rows),
                    "worst_ig_cpu_s": max(r["bertlab_ig_cpu_s"] for r in rows),
                    "median_ratio_vs_peer": statistics.median(r["ratio_vs_peer"] for r in rows),
                    "median_cpu_ratio_vs_peer": statistics.median(r["cpu_ratio_vs_peer"] for r in rows)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"completeness gap at the default steps: max {100 * worst.completeness_gap:.3f}% over {len(gaps)} inputs "
          f"({worst.target.name}); no-grad forward in an empty hook context / plain (CPU time): "
          f"{fwd_cpu['hooks'] / fwd_cpu['plain']:.3f}")
    print(f"wrote {args.out}")
    return 0


def _captum_version() -> str | None:
    try:
        import captum

        return captum.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
