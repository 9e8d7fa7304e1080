"""One fine-tuning step of a sentence classifier with its last layer computed at every position
against [CLS] alone (`Bert.forward(all_positions=False)`), same model, same batches, in one process.

Each turn runs forward + backward + AdamW step on a batch of SST-2-length random sentences (padded
within the batch, as the bucketing loop does); the two variants take turns step by step, so a burst of
background load hits both alike. Prints median step times and their ratio, and the largest logit
difference between the two paths (fp32, eval mode) on the same batch; writes bench/results/cls_only.json.

    python bench/bench_cls_only.py [--preset minilm|base] [--batch 32] [--seq 40] [--steps 12] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from turns import PRESETS, load_average, median_in_turns, meta


def main() -> None:
    import bertlab.families  # noqa: F401 (hands the model classes their family records)
    from bertlab.config import BertConfig
    from bertlab.families.bert import Bert

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", nargs="+", default=["minilm"], choices=list(PRESETS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=40, help="padded length of every batch")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "cls_only.json"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    load_start = load_average()
    rows = []
    for preset in a.preset:
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=30522, task="sequence_classification", id2label={0: "negative", 1: "positive"},
                         **PRESETS[preset])
        model = Bert(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1000, 30522, (a.batch, a.seq), generator=g)
        mask = torch.ones_like(ids)
        for i in range(a.batch):  # SST-2-like lengths: from a quarter of the batch's length to all of it
            mask[i, int(torch.randint(a.seq // 4, a.seq + 1, (1,), generator=g)):] = 0
        types = torch.zeros_like(ids)
        labels = torch.randint(0, 2, (a.batch,), generator=g)
        model.eval()
        with torch.no_grad():
            diff = float((model(ids, types, mask).logits - model(ids, types, mask, all_positions=False).logits)
                         .abs().max())
        model.train()
        for precision in a.precision:
            def step(all_positions: bool) -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    logits = model(ids, types, mask, all_positions=all_positions).logits
                F.cross_entropy(logits.float(), labels).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            variants = {"all_positions": lambda: step(True), "cls_only": lambda: step(False)}
            med = median_in_turns(variants, a.steps)
            row = {"preset": preset, "precision": precision, "batch": a.batch, "seq": a.seq,
                   "all_positions_ms": round(med["all_positions"] * 1000, 1),
                   "cls_only_ms": round(med["cls_only"] * 1000, 1),
                   "speedup": round(med["all_positions"] / med["cls_only"], 3),
                   "max_logit_diff_fp32": diff}
            rows.append(row)
            print(row, flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta(a.threads, a.steps, load_start), "rows": rows}, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
