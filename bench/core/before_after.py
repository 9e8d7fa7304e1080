"""Issue 47's before/after: the bench scripts' own results files, run on the tree before the model-core refactor
(7dc3b5f) and on the tree after it (same machine, one thread, one after the other), gathered into one file with
what became of each old speed device.

    python bench/core/before_after.py --dir DIR  # DIR holds before_*.json, after_*.json

DIR's files come from (each with --threads 1; before: the tree at the parent of the refactor):
bench_finetune.py --device cpu --task sst2 --variants bertlab-fp32 hf-grouped --no-count-work,
bench_forward.py --lengths 128 512 --models minilm, bench_pretrain.py --presets minilm --variants hf bertlab
--precision fp32 (before: with its default --heap kept, and once more with --heap default).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

OUT = Path(__file__).parent.parent / "results" / "core_before_after.json"
# what each old device was and where it went (kept ones: bertlab.fast)
DEVICES = {
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
    "packing": ("unpadding: the encoder on the real tokens alone", "kept: bertlab.fast.unpad_input/pad_output"),
    "cls_only": ("the last layer on the rows the heads read ([CLS] for a classifier)",
                 "kept: bertlab.fast.asked_rows"),
}


def _rows(path: Path) -> dict:
    return json.loads(path.read_text())


def _finetune(d: dict) -> dict:
    rows = {r["variant"]: r for r in d["rows"]}
    lab, hf = rows["bertlab-fp32"], rows["hf-grouped"]
    return {"bertlab_fp32_s": lab["seconds"], "bertlab_fp32_s_each": lab["seconds_each"],
            "hf_grouped_s": hf["seconds"], "hf_grouped_s_each": hf["seconds_each"],
            "speedup_vs_hf_grouped": round(hf["seconds"] / lab["seconds"], 3),
            # each round's own ratio (the two ran next to each other in it): less hit by a load that drifts
            "speedup_vs_hf_grouped_per_round": [round(h / x, 3) for x, h in zip(lab["seconds_each"],
                                                                                hf["seconds_each"])],
            "load_start": d["meta"]["load_avg_start"], "load_end": d["meta"]["load_avg_end"]}


def _forward(d: dict) -> list[dict]:
    keys = ("seq", "batch", "bertlab_plain", "hf_plain", "plain_ratio_vs_hf", "bertlab_capture", "hf_capture",
            "capture_ratio_vs_hf")
    return [{k: r[k] for k in keys if k in r} for r in d["rows"]]


def _pretrain(d: dict) -> dict:
    rows = {r["variant"]: r for r in d["rows"]}
    return {"bertlab_ms_per_step": rows["bertlab"]["ms_per_step"],
            "hf_ms_per_step": rows.get("hf", {}).get("ms_per_step"),
            "speedup_vs_hf": rows["bertlab"]["speedup_vs_hf"], "heap": d["meta"].get("heap")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()

    def get(name: str) -> dict | None:  # None: that bench did not finish
        return _rows(a.dir / name) if (a.dir / name).exists() else None

    def part(fn, name: str):
        d = get(name)
        return fn(d) if d is not None else None

    devices = [{"device": name, "what": what, "status": status} for name, (what, status) in DEVICES.items()]
    heap_default = a.dir / "before_pretrain_heap_default.json"
    out = {
        "meta": {"what": "issue 47: the model core before and after the refactor, same machine, 1 thread; "
                         "fine-tuning measured on a quiet machine (two rounds each, alternating trees), forward "
                         "and pre-training on a shared one (load averages in each part)"},
        "finetune_sst2_fp32": {"before": part(_finetune, "before_finetune.json"),
                               "after": part(_finetune, "after_finetune.json")},
        "forward": {"before": part(_forward, "before_forward.json"), "after": part(_forward, "after_forward.json"),
                    "load_before": part(lambda d: d["meta"].get("load_average"), "before_forward.json"),
                    "load_after": part(lambda d: d["meta"].get("load_average"), "after_forward.json")},
        "pretrain_fp32": {"before": part(_pretrain, "before_pretrain.json"),
                          "before_heap_default": part(_pretrain, heap_default.name),
                          "after": part(_pretrain, "after_pretrain.json")},
        "devices": devices,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
