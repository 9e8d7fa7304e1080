"""The command line with ModernBERT and DeBERTa-v3 (tiny random masked LMs written by transformers, tokenizers
trained in the test): fine-tune, compress the result, explain a prediction, probe the layers and patch a
masked word, each printing its one JSON line (or one line saying what to change)."""

from __future__ import annotations

import json

import pytest

from bertlab.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["modernbert", "deberta"])
def member(request, tmp_path_factory):
    import torch
    import transformers
    from test_family_deberta import VARIANTS, deberta_tokenizer
    from test_family_modernbert import modernbert_tokenizer, write_checkpoint

    root = tmp_path_factory.mktemp(request.param)
    if request.param == "modernbert":
        return request.param, write_checkpoint(root / "m", "ModernBertForMaskedLM", modernbert_tokenizer())
    hf_tok = deberta_tokenizer()
    torch.manual_seed(0)
    transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**{**VARIANTS["v3"], "vocab_size": len(hf_tok)})
                                      ).save_pretrained(root / "m")
    hf_tok.save_pretrained(root / "m")
    return request.param, root / "m"


def _line(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_the_commands_run_on_the_member(member, shared_data, tmp_path, capsys, monkeypatch):
    name, folder = member
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))
    ft = tmp_path / "sst2"
    assert main(["finetune", "--task", "sst2", "--model", str(folder), "--out", str(ft), "--max-train-examples", "32",
                 "--max-eval-examples", "16", "--epochs", "1", "--no-progress"]) == 0
    out = _line(capsys)
    assert out["status"] == "completed" and out["eval_examples"] == 16, name
    assert main(["compress", "quantize", "--model", str(ft), "--task", "sst2", "--out", str(tmp_path / "int8"),
                 "--max-eval-examples", "16", "--reps", "1", "--no-progress"]) == 0
    out = _line(capsys)
    assert out["method"] == "quantize" and (tmp_path / "int8").is_dir(), name
    assert main(["explain", "--model", str(folder), "--text", "The cat sat on the [MASK] today.", "--steps", "4"]) == 0
    out = _line(capsys)
    assert len(out["tokens"]) == len(out["scores"]) and "[MASK]" in "".join(out["tokens"]), name
    ud = shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"
    assert main(["probe", "--property", "upos", "--model", str(folder), "--train", str(ud),
                 "--max-train-sentences", "30", "--max-eval-sentences", "10"]) == 0
    out = _line(capsys)
    assert out["property"] == "upos" and len(out["accuracy"]) == len(out["layers"]) >= 3, name
    # two sentences of different lengths in this vocabulary: refused in one line that says so
    assert main(["patch", "--model", str(folder), "--clean", "The cat sat on the [MASK] today.", "--corrupt",
                 "The dog sat on the [MASK] today.", "--answer", "mat", "--wrong", "rug"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pieces" in err, (name, err)
