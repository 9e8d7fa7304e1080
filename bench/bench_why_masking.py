"""Why BERT masks, measured: MLM (both sides) against causal (left only) and ELMo (left + right, shallowly).

Per seed, three new tiny models pre-train on the same documents (ovos-wiki's training split) for the same steps,
batch, length and learning rate: `mlm` (BERT's masked words, no pair task), `causal` (GPT: next token, causal
mask) and `elmo` (a forward and a backward causal model trained together: twice the weights and the work of
causal); `untrained` is the same new MLM model with no step, the floor. Each model is then scored on:

- the middle word: in each of the held-out sentences (ovos-wiki's held_out split, never trained on), the token
  in the middle of the sentence, the same position for every model. MLM replaces it by [MASK] and reads both
  sides; causal guesses it from the left alone (its next-token guess at the position before); ELMo combines
  its forward model at the position before with its backward model at the position after
  (`middle_word_log_probs`). Top-1 and top-5; [UNK] targets are not scored.
- frozen features with a linear probe (scikit-learn's logistic regression), the model never changed: SST-2
  (the mean of the last layer over a sentence's tokens; trained on a seeded sample of train.tsv, scored on a
  sample of dev.tsv) and part of speech (CoNLL-2003's POS column; each word's last-layer vector, the mean of its
  pieces; trained on sentences of train.txt, scored on sentences of dev.txt). ELMo's feature is its two states
  side by side (`elmo_features`).

Mean and spread (sample sd, min, max) over the seeds; each row's gap to MLM is inside the spread when the two
models' ranges over the seeds overlap. Needs BERTLAB_DATA with sst2/ and conll2003/, and the ovos-wiki corpus.
Writes bench/results/why_masking.json.

    nice python bench/bench_why_masking.py [--steps 80] [--seeds 0 1 2] [--threads 1] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_masking import _load, overlap, spread  # noqa: E402 (the same spread rule as the masking bench)

OUT = ROOT / "bench" / "results" / "why_masking.json"
KINDS = ("untrained", "mlm", "causal", "elmo")
READS = {"untrained": "both sides (no training)", "mlm": "both sides, the word masked",
         "causal": "the left only", "elmo": "left and right, in two separate models"}
PROBE_ITERATIONS = 300  # lbfgs iterations at most per probe
METRICS = ("middle_top1", "middle_top5", "sst2", "pos")
QUICK = {"steps": 4, "seeds": [0, 1], "sentences": 40, "sst2_train": 60, "sst2_eval": 40, "pos_train": 30,
         "pos_eval": 20, "max_documents": 40}


# ---------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------
def pretrained(kind: str, seed: int, a: argparse.Namespace, tok, documents) -> tuple[dict, dict]:
    """({"model": ...} or {"forward": ..., "backward": ...} in eval mode, what the run reported)."""
    import torch

    from bertlab.training.pretrain import PretrainConfig, new_model, pretrain, pretrain_objective

    torch.manual_seed(seed)  # the new model's weights
    if kind == "untrained":
        return {"model": new_model("tiny", tok, pair_task="none").eval()}, {}
    common = dict(size="tiny", steps=a.steps, batch_size=a.batch, seq_len=a.seq, lr=a.lr, seed=seed,
                  device="cpu", precision="fp32", log_every=max(1, a.steps // 4))
    if kind == "mlm":
        model, _, result = pretrain(PretrainConfig(pair_task="none", **common), tokenizer=tok, documents=documents)
        models, loss_key = {"model": model}, "mlm_loss"
    else:
        run = pretrain_objective(PretrainConfig(objective=kind, **common), tokenizer=tok, documents=documents)
        result, loss_key = run.result, "lm_loss"
        models = ({"model": run.kept} if kind == "causal" else
                  {"forward": run.module.forward_lm.eval(), "backward": run.module.backward_lm.eval()})
    if result.status != "completed":
        raise SystemExit(f"{kind} seed {seed}: the run ended {result.status}: {result.error}")
    train_rows = [h for h in result.history if h.get("kind", "train") == "train" and loss_key in h]
    return models, {"train_loss": round(train_rows[-1][loss_key], 4) if train_rows else None}


def last_layer(kind: str, models: dict, ids, mask):
    """[batch, seq, d] last-layer states (ELMo: [batch, seq, 2 d], the two directions side by side)."""
    import torch

    from bertlab.training.objectives.elmo import elmo_features

    with torch.inference_mode():
        if kind == "elmo":
            return elmo_features(models["forward"], models["backward"], ids, mask)
        nowhere = torch.zeros_like(mask, dtype=torch.bool)  # no LM head: states only
        return models["model"](ids, None, mask, mlm_positions=nowhere).last_hidden_state


# ---------------------------------------------------------------------------------------------
# (a) the middle word of held-out sentences
# ---------------------------------------------------------------------------------------------
def middle_word_set(tok, documents, n: int, max_len: int) -> list[tuple[list[int], int]]:
    """Up to `n` held-out sentences as ([CLS] ids [SEP], the middle position): sentences of 5 to `max_len` - 2
    pieces whose middle token is not [UNK], in corpus order."""
    out = []
    for doc in documents:
        for ids in tok.encode_ids(doc.sentences):
            if 5 <= len(ids) <= max_len - 2:
                i = 1 + len(ids) // 2  # [CLS] is position 0
                row = [tok.cls_token_id, *ids, tok.sep_token_id]
                if row[i] != tok.unk_token_id:
                    out.append((row, i))
            if len(out) == n:
                return out
    return out


def middle_word_logits(kind: str, models: dict, tok, ids, mask, at):
    """[batch, vocab] scores for the token at position `at` [batch] of each row of `ids` [batch, seq], read as
    the model can: MLM (and the untrained floor) with that token replaced by [MASK]; causal from the position
    before (its next-token guess); ELMo from both neighbours (`middle_word_log_probs`). None reads the token."""
    import torch

    from bertlab.training.objectives.elmo import middle_word_log_probs

    rows = torch.arange(ids.shape[0])
    with torch.inference_mode():
        if kind == "elmo":
            return middle_word_log_probs(models["forward"], models["backward"], ids, mask)[rows, at]
        inputs = ids.clone()
        if kind != "causal":
            inputs[rows, at] = tok.mask_token_id
        picked = torch.zeros_like(mask, dtype=torch.bool)
        picked[rows, at - 1 if kind == "causal" else at] = True
        return models["model"](inputs, None, mask, mlm_positions=picked).mlm_logits


def middle_word_scores(kind: str, models: dict, tok, items, batch_size: int = 32) -> dict[str, float]:
    """Top-1 and top-5 accuracy at each sentence's middle position (`middle_word_logits`)."""
    import torch

    from bertlab.tasks.batching import pad_inputs

    top1 = top5 = 0
    for s in range(0, len(items), batch_size):
        chunk = items[s : s + batch_size]
        ids, _, mask = pad_inputs([r for r, _ in chunk], [None] * len(chunk), tok.pad_token_id)
        at = torch.tensor([i for _, i in chunk])
        targets = ids[torch.arange(len(chunk)), at]
        best = middle_word_logits(kind, models, tok, ids, mask, at).topk(5, dim=-1).indices  # [batch, 5]
        top1 += int((best[:, 0] == targets).sum())
        top5 += int((best == targets[:, None]).any(-1).sum())
    return {"middle_top1": top1 / len(items), "middle_top5": top5 / len(items)}


# ---------------------------------------------------------------------------------------------
# (b) frozen features, linear probes
# ---------------------------------------------------------------------------------------------
def sentence_features(kind: str, models: dict, tok, texts, batch_size: int = 32):
    """[n, d] numpy: each text's last layer averaged over its tokens ([CLS] and [SEP] included)."""
    import torch

    out = []
    for s in range(0, len(texts), batch_size):
        enc = tok.encode_batch(texts[s : s + batch_size], max_length=128)
        states = last_layer(kind, models, enc.input_ids, enc.attention_mask)
        m = enc.attention_mask[..., None].float()
        out.append((states * m).sum(1) / m.sum(1))
    return torch.cat(out).numpy()


def word_vectors(kind: str, models: dict, tok, sentences, batch_size: int = 32):
    """[words, d] numpy: each word's last-layer vector, the mean of its pieces (words cut at 128 tokens dropped),
    and the indices of the kept words per sentence."""
    import torch

    from bertlab.tasks.features import encode_words
    from bertlab.tasks.layer_features import pool_words

    vectors, kept = [], []
    for s in range(0, len(sentences), batch_size):
        chunk = sentences[s : s + batch_size]
        encoded = [encode_words(x.words, tok, max_length=128) for x in chunk]
        n = max(len(ids) for ids, _ in encoded)
        ids = torch.full((len(chunk), n), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (row, _) in enumerate(encoded):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        states = last_layer(kind, models, ids, mask)
        for i, (_, word_ids) in enumerate(encoded):
            words = pool_words(states[i][None], word_ids, "mean")[0]  # [words, d]
            vectors.append(words)
            kept.append(words.shape[0])
    return torch.cat(vectors).numpy(), kept


def probe(x_train, y_train, x_eval, y_eval) -> float:
    """Accuracy on the evaluation rows of a logistic regression trained on the training rows (features
    standardised on the training rows)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=PROBE_ITERATIONS))
    with warnings.catch_warnings():  # lbfgs stopping at the cap is part of the recipe (the meta says so)
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train, y_train)
    return float(clf.score(x_eval, y_eval))


def probe_scores(kind: str, models: dict, tok, tasks: dict) -> dict[str, float]:
    sst_train, sst_eval = tasks["sst2"]
    fx = sentence_features(kind, models, tok, [e.text_a for e in sst_train])
    fe = sentence_features(kind, models, tok, [e.text_a for e in sst_eval])
    sst2 = probe(fx, [e.label for e in sst_train], fe, [e.label for e in sst_eval])
    pos_train, pos_eval = tasks["pos"]
    out = {"sst2": sst2}
    (xw, kw), (ew, ke) = word_vectors(kind, models, tok, pos_train), word_vectors(kind, models, tok, pos_eval)
    tags = lambda sents, kept: [t for s, k in zip(sents, kept) for t in s.tags["pos"][:k]]  # noqa: E731
    out["pos"] = probe(xw, tags(pos_train, kw), ew, tags(pos_eval, ke))
    return out


def probe_tasks(a: argparse.Namespace) -> dict:
    """SST-2 and POS: (train, evaluate) samples, seeded, train from the training files only."""
    from bertlab.analysis.probe_data import read_conll2003
    from bertlab.settings import data_path
    from bertlab.tasks.readers import read_sst2

    rng = random.Random(0)
    sst_train = rng.sample(read_sst2("train"), a.sst2_train)
    sst_eval = rng.sample(read_sst2("dev"), a.sst2_eval)
    pos_train = rng.sample(read_conll2003(data_path("conll2003", "train.txt")), a.pos_train)
    pos_eval = rng.sample(read_conll2003(data_path("conll2003", "dev.txt")), a.pos_eval)
    return {"sst2": (sst_train, sst_eval), "pos": (pos_train, pos_eval)}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--sentences", type=int, default=500, help="held-out sentences scored (default 500)")
    p.add_argument("--sst2-train", type=int, default=1000)
    p.add_argument("--sst2-eval", type=int, default=872)
    p.add_argument("--pos-train", type=int, default=500, help="CoNLL-2003 train.txt sentences (default 500)")
    p.add_argument("--pos-eval", type=int, default=300, help="CoNLL-2003 dev.txt sentences (default 300)")
    p.add_argument("--max-documents", type=int, default=None, help="pre-train on the first N documents only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a smoke run: a few steps, two seeds, small samples")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    if "mlm" not in a.kinds:
        raise SystemExit("--kinds must include mlm: every other row is compared with it.")

    import torch

    torch.set_num_threads(a.threads)
    from bertlab.loading import default_model_folder
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.corpora import load_corpus

    load_start, t0 = _load(), time.time()
    tok = Tokenizer.from_folder(default_model_folder())
    train = load_corpus("ovos-wiki", split="train")[: a.max_documents]  # held_out never trains
    items = middle_word_set(tok, load_corpus("ovos-wiki", split="held_out"), a.sentences, a.seq)
    tasks = probe_tasks(a)
    runs = []
    for seed in a.seeds:
        for kind in a.kinds:
            t = time.time()
            models, report = pretrained(kind, seed, a, tok, train)
            scores = {**middle_word_scores(kind, models, tok, items), **probe_scores(kind, models, tok, tasks)}
            runs.append({"kind": kind, "seed": seed, "seconds": round(time.time() - t, 1), **report,
                         **{k: round(v, 4) for k, v in scores.items()}})
            print(json.dumps(runs[-1]), flush=True)
    rows = []
    for kind in a.kinds:
        mine = [r for r in runs if r["kind"] == kind]
        rows.append({"kind": kind, "reads": READS[kind], **{m: spread([r[m] for r in mine]) for m in METRICS}})
    mlm = next(r for r in rows if r["kind"] == "mlm")
    for r in rows:  # the comparisons the page states: each model against MLM
        if r is not mlm:
            r["vs_mlm"] = {m: {"gap": round(r[m]["mean"] - mlm[m]["mean"], 4), "inside_spread": overlap(r[m], mlm[m])}
                           for m in METRICS}
    data = {
        "meta": {"command": " ".join(["python bench/bench_why_masking.py",
                                     *(argv if argv is not None else sys.argv[1:])]),
                 "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": a.threads,
                 "size": "tiny", "steps": a.steps, "batch": a.batch, "seq_len": a.seq, "lr": a.lr, "seeds": a.seeds,
                 "corpus": "ovos-wiki train split", "documents": len(train),
                 "held_out": "ovos-wiki held_out split", "held_out_sentences": len(items),
                 "sst2": f"{a.sst2_train} sentences of sst2/train.tsv → {a.sst2_eval} of sst2/dev.tsv",
                 "pos": f"{a.pos_train} sentences of conll2003/train.txt → {a.pos_eval} of conll2003/dev.txt",
                 "probe": (f"scikit-learn LogisticRegression (lbfgs, at most {PROBE_ITERATIONS} iterations) on "
                           "standardised frozen last-layer features"),
                 "precision": "fp32", "device": "cpu", "quick": a.quick,
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
