"""A sentence classifier's training step with the encoder packing the real tokens (`bertlab.fast.unpad_input`,
what training does) against the padded path (`model.bert.packing = False`), same model, same batches, in one
process.

Each turn runs forward + backward + AdamW step on a batch padded to its longest sentence, with SST-2-like
lengths from half the batch's length to all of it (a bucketed batch's padding); the two variants take turns
step by step (the order flipping every round), so a burst of background load hits both alike. Prints median
step times and their ratio, and the largest difference of the logits between the two (dropout off, fp32);
writes bench/results/packing.json.

    python bench/bench_packing.py [--preset minilm base] [--batch 32] [--seq 18 40] [--steps 12] [--threads 1]
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
    p.add_argument("--seq", type=int, nargs="+", default=[18, 40], help="padded length of the batch")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "packing.json"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    load_start = load_average()
    rows = []
    for preset in a.preset:
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=30522, task="sequence_classification", id2label={0: "negative", 1: "positive"},
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **PRESETS[preset])
        model = Bert(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        for seq in a.seq:
            g = torch.Generator().manual_seed(1)
            ids = torch.randint(1000, 30522, (a.batch, seq), generator=g)
            mask = torch.ones_like(ids)
            for i in range(1, a.batch):  # one sentence fills the batch; the others from half its length up
                mask[i, int(torch.randint(seq // 2, seq + 1, (1,), generator=g)):] = 0
            types = torch.zeros_like(ids)
            labels = torch.randint(0, 2, (a.batch,), generator=g)
            with torch.no_grad():
                model.bert.packing = True
                packed = model(ids, types, mask).logits
                model.bert.packing = False
                diff = float((packed - model(ids, types, mask).logits).abs().max())
            for precision in a.precision:
                def step(packing: bool) -> None:
                    model.bert.packing = packing
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        logits = model(ids, types, mask, all_positions=False).logits
                    F.cross_entropy(logits.float(), labels).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                variants = {"padded": lambda: step(False), "packed": lambda: step(True)}
                med = median_in_turns(variants, a.steps)
                row = {"preset": preset, "precision": precision, "batch": a.batch, "seq": seq,
                       "padding": round(1 - float(mask.float().mean()), 3),
                       "padded_ms": round(med["padded"] * 1000, 1), "packed_ms": round(med["packed"] * 1000, 1),
                       "speedup": round(med["padded"] / med["packed"], 3), "max_logit_diff_fp32": diff}
                rows.append(row)
                print(row, flush=True)
    model.bert.packing = True
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta(a.threads, a.steps, load_start), "rows": rows}, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
