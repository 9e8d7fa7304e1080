"""Issue 47's before/after: the bench scripts' own results files, run on the tree before the model-core refactor
(7dc3b5f) and on the tree after it (same machine, one thread, one after the other), gathered into one file with
what became of each old speed device.

    python bench/core/before_after.py --dir DIR  # DIR holds before_*.json and after_*.json

DIR's files come from (each with --threads 1): bench_finetune.py --device cpu --task sst2 --variants bertlab-fp32
hf-grouped --no-count-work (finetune), bench_forward.py --lengths 128 512 --models minilm (forward),
bench_pretrain.py --presets minilm --variants hf bertlab --precision fp32 (pretrain).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

OUT = Path(__file__).parent.parent / "results" / "core_before_after.json"
FT_AIM = 1.4  # the default path against HF's grouped `Trainer`, SST-2 fp32 (issue 47)
DEVICES = {  # what each old device was, and what became of it (kept ones: bertlab.fast)
    "dropout_bypass": ("an eval-mode Dropout.__call__ that skipped nn.Module's call machinery", "deleted"),
    "dropout_scale": ("Dropout's mask drawn from 16-bit halves of random int32s, not bernoulli_", "deleted"),
    "head_major": ("_HeadMajor/_PaddedHeadMajor: CPU training attention through eager products laid out head "
                   "by head, instead of SDPA", "deleted"),
    "stacked_projection": ("_stacked_projection: q, k, v from one matmul of stacked weights while packed",
                           "deleted"),
    "grad_table": ("GradTable/_LookupIntoGrad: the word table's gradient kept between steps, zeroed by rows",
                   "deleted"),
    "grad_scale": ("the clip handed to the fused AdamW as optimizer.grad_scale (private), not clip_grad_norm_",
                   "deleted"),
    "heap": ("glibc heap tuning while training (mallopt, kept_heap, HeapCreep)", "deleted"),
    "int8_engine": ("bertlab.compressed.engine: an int8 model's forward compiled with TorchScript, kept bit-equal "
                    "to the modules by hand, reading torch's private hook tables", "deleted: the Compression tab "
                    "exports the int8 model to ONNX Runtime and times it beside torch's int8"),
    "packing": ("unpadding: the encoder on the real tokens alone",
                "kept for fp32 on a CPU, where it pays: bertlab.fast.unpad_input/pad_output"),
    "cls_only": ("the last layer on the rows the heads read ([CLS] for a classifier)",
                 "kept: bertlab.fast.asked_rows"),
}


def rows(before: dict, after: dict) -> list[dict]:
    """One row a figure: its value on each tree."""
    def ft(d: dict) -> float:  # HF grouped's seconds over bertlab's, every round summed
        by = {r["variant"]: r["seconds"] for r in d["finetune"]["rows"]}
        return round(by["hf-grouped"] / by["bertlab-fp32"], 3)

    def pt(d: dict) -> float:
        return next(r["speedup_vs_hf"] for r in d["pretrain"]["rows"] if r["variant"] == "bertlab")

    out = [{"bench": "fine-tuning SST-2 fp32: HF grouped's time ÷ bertlab's", "before": ft(before),
            "after": ft(after), "aim": FT_AIM}]
    out += [{"bench": f"forward at {b['seq']} tokens: bertlab's time ÷ HF's", "before": b["plain_ratio_vs_hf"],
             "after": a["plain_ratio_vs_hf"], "aim": None}
            for b, a in zip(before["forward"]["rows"], after["forward"]["rows"])]
    return out + [{"bench": "pre-training MiniLM fp32: speed-up vs HF", "before": pt(before), "after": pt(after),
                   "aim": None}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, help="the before_/after_{finetune,forward,pretrain}.json files")
    p.add_argument("--devices-only", action="store_true", help="rewrite the devices' list of --out alone")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    devices = [{"device": k, "what": w, "status": s} for k, (w, s) in DEVICES.items()]
    if a.devices_only:
        a.out.write_text(json.dumps({**json.loads(a.out.read_text()), "devices": devices}, indent=2) + "\n")
        return
    tree = {t: {b: json.loads((a.dir / f"{t}_{b}.json").read_text()) for b in ("finetune", "forward", "pretrain")}
            for t in ("before", "after")}
    out = {"meta": {"what": "the model core before (7dc3b5f) and after the refactor, same machine, 1 thread; "
                            "fine-tuning on a quiet machine (two rounds each, the trees alternating), forward and "
                            "pre-training on a shared one",
                    "load_average": {t: {b: d["meta"].get("load_avg_start") or d["meta"].get("load_average")
                                         for b, d in v.items()} for t, v in tree.items()}},
           "rows": rows(tree["before"], tree["after"]),
           "devices": devices}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
