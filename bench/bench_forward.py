"""Forward latency of bertlab's BERT-family models against Hugging Face transformers, same machine, same input.

Models: MiniLM (the offline default's real weights), a random BERT-base-shaped BERT, and random RoBERTa,
ALBERT, DistilBERT, ELECTRA, ModernBERT and DeBERTa-v3 encoders of MiniLM's shape (6 layers, 384 wide, 12
heads; ALBERT and ELECTRA with 128-wide factorised embeddings; ModernBERT with its GeGLU width and a 128-token
local window, so the 512-token rows show the band). transformers runs DeBERTa's disentangled attention only
eagerly: its "plain" row is its eager forward without outputs asked for. Each random model is written once by
transformers' save_pretrained and read by both libraries (bertlab through `load_model`), so both run the same
weights.

Two modes:
  plain    bertlab (no hooks, fused attention) vs HF BertModel (default SDPA attention)
  capture  bertlab run_with_cache(every attention pattern + every layer's hidden state + embeddings)
           vs HF (eager attention, output_attentions=True, output_hidden_states=True)
  view     what one attention view shows, through `run_with_cache(layers=..., heads=..., dtype=float16)`:
           "layer" = every head of the middle layer, "head" = head 0 of every layer (fused attention
           elsewhere; only the asked heads' patterns are computed)
  mixed    MiniLM on a batch of `--mixed-batch` real SST-2 dev sentences of different lengths (BERTLAB_DATA),
           padded to the longest: bertlab padded, bertlab packed (`model.bert.packing = "always"`: the real
           tokens only through the linears, LayerNorms and feed-forward) and HF (SDPA), in turns; the
           packed outputs are checked against HF's at the real tokens
The six variants take turns call by call. Prints a table of median latencies and ratios
(bertlab / HF: below 1 = bertlab faster) and the
capture overhead (bertlab capture / bertlab plain), and writes bench/results/forward.json.

    python bench/bench_forward.py [--quick] [--batch 4] [--repeats 15] [--models ...] [--keep-other-rows]
    BERTLAB_DATA=../shared/data python bench/bench_forward.py --mixed-only   # the mixed row alone, other rows kept
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

CAPTURED = ("hook_pattern", "hook_resid_post", "embeddings.hook_out")
SMALL = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
# model name -> (transformers config class, its kwargs, bare encoder class): random weights, written by the script
RANDOM = {
    "bert-base-random": ("BertConfig", {}, "BertModel"),
    "roberta-random": ("RobertaConfig", {**SMALL, "max_position_embeddings": 514, "type_vocab_size": 1},
                       "RobertaModel"),
    "albert-random": ("AlbertConfig", {**SMALL, "embedding_size": 128}, "AlbertModel"),
    "distilbert-random": ("DistilBertConfig", dict(vocab_size=30522, dim=384, n_layers=6, n_heads=12,
                                                   hidden_dim=1536), "DistilBertModel"),
    "electra-random": ("ElectraConfig", {**SMALL, "embedding_size": 128}, "ElectraModel"),
    # ModernBERT's MLP ratio (GeGLU, 1.5 x hidden), a 128-token local window, every third layer global
    "modernbert-random": ("ModernBertConfig", {**SMALL, "intermediate_size": 576, "local_attention": 128,
                                               "global_attn_every_n_layers": 3, "pad_token_id": 0,
                                               "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
                                               "sep_token_id": 2}, "ModernBertModel"),
    # DeBERTa-v3's settings (relative positions only, 256 buckets, shared keys, no segments), MiniLM's shape
    "deberta-v3-random": ("DebertaV2Config", {**SMALL, "relative_attention": True, "position_buckets": 256,
                                              "max_relative_positions": -1, "norm_rel_ebd": "layer_norm",
                                              "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
                                              "position_biased_input": False, "type_vocab_size": 0,
                                              "layer_norm_eps": 1e-7}, "DebertaV2Model"),
}
FAMILIES = ["roberta-random", "albert-random", "distilbert-random", "electra-random", "modernbert-random"]


def _time_all(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each `fn()`, after two warm-up calls each. The variants take turns call by
    call (in a rotating order), so a burst of background load hits them alike."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def _models(name: str):
    """(bertlab model, HF with SDPA attention, HF with eager attention), the same weights in all three."""
    import tempfile

    import transformers

    from bertlab.loading import default_model_folder, load_model

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if name == "minilm":
        folder = default_model_folder()
        ours, _ = load_model(folder)
        hf_sdpa = transformers.BertModel.from_pretrained(folder, attn_implementation="sdpa")
        hf_eager = transformers.BertModel.from_pretrained(folder, attn_implementation="eager")
        return ours.eval(), hf_sdpa.eval(), hf_eager.eval()
    config_class, kwargs, model_class = RANDOM[name]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:  # the same random weights behind all three
        cls = getattr(transformers, model_class)
        cls(getattr(transformers, config_class)(**kwargs)).save_pretrained(folder)
        plain = "eager" if not cls._supports_sdpa else "sdpa"  # DeBERTa: eager only
        hf_sdpa = cls.from_pretrained(folder, attn_implementation=plain)
        hf_eager = cls.from_pretrained(folder, attn_implementation="eager")
        ours, _ = load_model(folder)
    return ours.eval(), hf_sdpa.eval(), hf_eager.eval()


def run(batch: int, lengths: list[int], repeats: int, models: list[str]) -> list[dict]:
    rows = []
    for name in models:
        ours, hf_sdpa, hf_eager = _models(name)
        vocab = ours.config.vocab_size
        for seq in lengths:
            g = torch.Generator().manual_seed(seq)
            ids = torch.randint(1000, vocab, (batch, seq), generator=g)
            types = torch.zeros_like(ids)
            mask = torch.ones_like(ids)
            hf_in = dict(input_ids=ids, attention_mask=mask)
            if ours.family.has_segments:  # DistilBERT takes no token_type_ids
                hf_in["token_type_ids"] = types
            names = lambda n: n.endswith(CAPTURED)  # noqa: E731
            pattern = lambda n: n.endswith("hook_pattern")  # noqa: E731
            middle = ours.family.num_layers // 2
            with torch.inference_mode():
                t = _time_all({
                    "bertlab_plain": lambda: ours(ids, types, mask),
                    "hf_plain": lambda: hf_sdpa(**hf_in),
                    "bertlab_capture": lambda: ours.run_with_cache(ids, types, mask, names=names),
                    "hf_capture": lambda: hf_eager(**hf_in, output_attentions=True, output_hidden_states=True),
                    "bertlab_view_layer": lambda: ours.run_with_cache(ids, types, mask, names=pattern, layers=[middle],
                                                                      dtype=torch.float16),
                    "bertlab_view_head": lambda: ours.run_with_cache(ids, types, mask, names=pattern, heads=[0],
                                                                     dtype=torch.float16),
                }, repeats)
            row = {"model": name, "batch": batch, "seq": seq, **{k: round(v * 1000, 2) for k, v in t.items()}}
            row["plain_ratio_vs_hf"] = round(t["bertlab_plain"] / t["hf_plain"], 3)
            row["capture_ratio_vs_hf"] = round(t["bertlab_capture"] / t["hf_capture"], 3)
            row["capture_overhead"] = round(t["bertlab_capture"] / t["bertlab_plain"], 3)
            row["view_layer_overhead"] = round(t["bertlab_view_layer"] / t["bertlab_plain"], 3)
            row["view_head_overhead"] = round(t["bertlab_view_head"] / t["bertlab_plain"], 3)
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


def mixed_sentences(n: int) -> list[str]:
    """`n` SST-2 dev sentences (BERTLAB_DATA) whose lengths spread from short to long: the shortest, the
    longest and evenly spaced ranks between, among the first 400 sentences of the file."""
    import csv

    from bertlab.settings import data_dir

    with open(data_dir() / "sst2" / "dev.tsv", newline="", encoding="utf-8") as f:
        sentences = sorted({r["sentence"].strip() for _, r in zip(range(400), csv.DictReader(f, delimiter="\t"))},
                           key=lambda t: (len(t.split()), t))
    return [sentences[round(i * (len(sentences) - 1) / (n - 1))] for i in range(n)]


def run_mixed(batch: int, repeats: int) -> dict:
    """The mixed-length row: bertlab padded and packed against HF on one batch of real sentences."""
    import copy

    from bertlab.loading import load

    ours, hf_sdpa, _ = _models("minilm")
    _, tok = load("default-encoder")
    enc = tok.encode_batch(mixed_sentences(batch))
    ids, types, mask = enc.input_ids, enc.token_type_ids, enc.attention_mask
    packed = copy.deepcopy(ours)
    packed.bert.packing = "always"
    with torch.inference_mode():
        keep = mask.bool()
        hf_out = hf_sdpa(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        diff = float((packed(ids, types, mask).last_hidden_state - hf_out)[keep].abs().max())
        t = _time_all({
            "bertlab_padded": lambda: ours(ids, types, mask),
            "bertlab_packed": lambda: packed(ids, types, mask),
            "hf_plain": lambda: hf_sdpa(input_ids=ids, token_type_ids=types, attention_mask=mask),
        }, repeats)
    lengths = mask.sum(1).tolist()
    row = {"model": "minilm", "batch": batch, "lengths": lengths, "tokens": sum(lengths),
           "padded_tokens": ids.numel(), **{k: round(v * 1000, 2) for k, v in t.items()},
           "packed_ratio_vs_hf": round(t["bertlab_packed"] / t["hf_plain"], 3),
           "padded_ratio_vs_hf": round(t["bertlab_padded"] / t["hf_plain"], 3),
           "packed_max_diff_vs_hf": float(f"{diff:.2g}")}
    print(json.dumps(row), flush=True)
    return row


HEADER = ("| model | batch | seq | bertlab plain ms | HF plain ms | ratio | bertlab capture ms | HF capture ms "
          "| ratio | capture / plain | one layer / plain | one head / plain |\n" + "|---" * 12 + "|")


def _fmt(r: dict) -> str:
    return (f"| {r['model']} | {r['batch']} | {r['seq']} | {r['bertlab_plain']} | {r['hf_plain']} | "
            f"{r['plain_ratio_vs_hf']} | {r['bertlab_capture']} | {r['hf_capture']} | {r['capture_ratio_vs_hf']} | "
            f"{r['capture_overhead']} | {r.get('view_layer_overhead', '')} | {r.get('view_head_overhead', '')} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512])
    p.add_argument("--models", nargs="+", default=["minilm", *RANDOM], choices=["minilm", *RANDOM])
    p.add_argument("--keep-other-rows", action="store_true",
                   help="keep the rows of models not run from the existing results file")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--quick", action="store_true", help="3 repeats, short sequences, MiniLM and the families")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "forward.json"))
    p.add_argument("--mixed-batch", type=int, default=8, help="sentences in the mixed-length batch")
    p.add_argument("--mixed-only", action="store_true",
                   help="run the mixed-length row alone; the results file keeps its other rows")
    a = p.parse_args()
    if a.quick:
        a.repeats, a.lengths, a.models = 3, [16, 128], ["minilm", *FAMILIES]
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    old = json.loads(out.read_text()) if out.is_file() else {}

    def meta() -> dict:
        return {"torch": torch.__version__, "threads": a.threads, "cpu": platform.processor() or platform.machine(),
                "device": "cpu", "repeats": a.repeats, "load_average": [round(x, 2) for x in os.getloadavg()]}

    if a.mixed_only:
        result = {**old, "mixed": {"meta": meta(), "row": run_mixed(a.mixed_batch, a.repeats)}}
    else:
        print(HEADER)
        rows = run(a.batch, a.lengths, a.repeats, a.models)
        run_meta = meta()
        if a.keep_other_rows and old:  # rows measured in another run, with that run's meta
            kept = [r for r in old.get("rows", []) if r["model"] not in a.models]
            if kept:
                run_meta["other_rows_meta"] = old.get("meta")
            rows = kept + rows
        result = {"meta": run_meta, "rows": rows,
                  "mixed": {"meta": meta(), "row": run_mixed(a.mixed_batch, a.repeats)}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
