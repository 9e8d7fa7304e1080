"""How quickly the dashboard answers a student, on the offline default model.

Two figures, each against its aim from the exploration-dashboard issue:
  startup      seconds from a fresh Python process to the app built (import bertlab, load the
               model and its heads, build the picker and the first tab): what the Voila kernel does
               before the page can show. Aim: <= 3 s (Voila's --preheat_kernel, which `bertlab serve`
               uses, does this before anyone opens the page).
  interaction  milliseconds from a widget edit to the figure redrawn (the callbacks run
               synchronously in the kernel), at 32 tokens; p50 and p95 over --repeats edits.
               Aim: p95 <= 100 ms. Browser rendering and the websocket are not counted.
There is no peer for these (no other BERT explorer has these panels); the ratio printed is
against the aim (below 1 = within it). Results go to bench/results/dashboard.json.

    python bench/bench_dashboard.py [--repeats 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# 32 tokens with [CLS] and [SEP] (the "32 tokens"): a real sentence, not padding.
TEXT = ("The old fisherman sat quietly on the muddy bank of the river and watched the small boats drift "
        "slowly past the little village where he was born long ago.")
TEXT_2 = ("A young teacher stood by the open door of the school and greeted the children walking in from "
          "the cold grey morning outside the old iron gates early today.")
STARTUP = (
    "import time; t = time.perf_counter(); from bertlab.panels.app import build_app; app = build_app(); "
    "print(time.perf_counter() - t)"
)
AIM_MS, AIM_STARTUP_S = 100.0, 3.0


def startup_seconds(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True)
        out.append(float(done.stdout.strip().splitlines()[-1]))
    return out


def _flip(widget, a, b):
    widget.value = b if widget.value == a else a


def interactions(model, tok) -> dict[str, tuple[object, callable]]:
    """name -> (panel, edit): each edit changes one widget the way a student would."""
    from bertlab.panels.ablation import AblationPanel
    from bertlab.panels.attention import AttentionPanel
    from bertlab.panels.mask import MaskPanel
    from bertlab.panels.nsp import NSPPanel
    from bertlab.panels.representation import RepresentationPanel
    from bertlab.panels.similarity import SimilarityPanel

    attention = AttentionPanel(model, tok, text=TEXT)
    mask = MaskPanel(model, tok, text=TEXT)
    mask_word = mask.word_buttons.children[4]
    nsp = NSPPanel(model, tok)
    rep = RepresentationPanel(model, tok)
    sim = SimilarityPanel(model, tok)
    ablation = AblationPanel(model, tok)
    first_head = ablation.head_buttons[5][3]

    def new_text(panel, box, button):
        _flip(box, TEXT, TEXT_2)
        button.click()

    return {
        "attention: layer slider": (attention, lambda: _flip(attention.layer, 1, 2)),
        "attention: head slider": (attention, lambda: _flip(attention.head, 3, 4)),
        "attention: new sentence": (attention, lambda: new_text(attention, attention.text_a, attention.show_button)),
        "attention: rollout view, layer": (attention, lambda: (setattr(attention.view, "value", "Rollout"),
                                                               _flip(attention.layer, 3, 4))),
        "mask: click a word": (mask, lambda: setattr(mask_word, "value", not mask_word.value)),
        "mask: top-k slider": (mask, lambda: _flip(mask.k, 5, 8)),
        "mask: new sentence": (mask, lambda: new_text(mask, mask.text, mask.predict_button)),
        "next sentence: check new B": (nsp, lambda: new_text(nsp, nsp.text_b, nsp.check_button)),
        "input: new sentence": (rep, lambda: new_text(rep, rep.text_a, rep.show_button)),
        "embeddings: layer slider": (sim, lambda: _flip(sim.token_stage, sim.token_stage.options[2][1],
                                                        sim.token_stage.options[3][1])),
        "ablation: switch a head off/on": (ablation, lambda: setattr(first_head, "value", not first_head.value)),
    }


def time_edits(edits, repeats: int) -> list[dict]:
    rows = []
    for name, (panel, edit) in edits.items():
        edit()  # warm-up (first call builds caches)
        ms = []
        for _ in range(repeats):
            t = time.perf_counter()
            edit()
            ms.append((time.perf_counter() - t) * 1000)
        errors = [text for level, text in panel.messages if level == "error"]
        if errors:
            raise SystemExit(f"{name}: the panel reported an error, the timing would mean nothing: {errors}")
        ms.sort()
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        rows.append({"interaction": name, "p50_ms": round(statistics.median(ms), 1), "p95_ms": round(p95, 1),
                     "max_ms": round(ms[-1], 1), "p95_vs_aim": round(p95 / AIM_MS, 2)})
        print(f"| {name} | {rows[-1]['p50_ms']} | {rows[-1]['p95_ms']} | {rows[-1]['max_ms']} | "
              f"{rows[-1]['p95_vs_aim']} |", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--startup-runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--quick", action="store_true", help="5 repeats, one startup run")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "dashboard.json"))
    a = p.parse_args()
    if a.quick:
        a.repeats, a.startup_runs = 5, 1
    torch.set_num_threads(a.threads)
    import logging

    logging.disable(logging.WARNING)  # the panels log cut texts etc.; the table is the output here
    from bertlab.loading import load

    model, tok = load(None)
    assert len(tok.encode(TEXT)) == len(tok.encode(TEXT_2)) == 32, (len(tok.encode(TEXT)), len(tok.encode(TEXT_2)))
    print("| interaction (offline default, 32 tokens) | p50 ms | p95 ms | max ms | p95 / 100 ms |\n"
          "|---|---|---|---|---|")
    rows = time_edits(interactions(model, tok), a.repeats)
    starts = startup_seconds(a.startup_runs)
    startup = {"median_s": round(statistics.median(starts), 2), "runs_s": [round(s, 2) for s in starts],
               "vs_aim": round(statistics.median(starts) / AIM_STARTUP_S, 2)}
    print(f"\nstartup (fresh process -> app built): median {startup['median_s']} s over {len(starts)} runs "
          f"({startup['vs_aim']} of the 3 s aim)")
    meta = {"torch": torch.__version__, "threads": a.threads, "cpu": platform.processor() or platform.machine(),
            "repeats": a.repeats, "tokens": len(tok.encode(TEXT))}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "interactions": rows, "startup": startup}, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
