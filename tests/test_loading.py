"""Loading from a hub cache (offline), local folders, .bin files; each broken checkpoint's message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertlab.loading import CheckpointError, load, save_pretrained


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _ids(tok):
    b = tok.encode_batch(["the cat sat on the mat"], ["it was happy"])
    return b.input_ids, b.token_type_ids


def test_hub_name_loads_offline_from_a_hub_layout_cache(tmp_path, tiny_checkpoints):
    """A cache folder as huggingface_hub writes it, read with HF_HUB_OFFLINE=1 in a fresh process."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--tiny-bert"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tiny_checkpoints["BertForPreTraining"], snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    code = (
        "from bertlab.loading import load\n"
        "m, t = load('tiny-org/tiny-bert')\n"
        "print(m.has_mlm, m.has_nsp, m.load_report.folder.name, len(t.encode('hello there')))\n"
        "from bertlab.loading import CheckpointError\n"
        "try:\n    load('tiny-org/not-cached')\nexcept CheckpointError as e:\n    print('ERR', e)\n"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(f"True True {commit}")
    assert lines[1].startswith("ERR tiny-org/not-cached is not in the local Hugging Face cache")


def test_pytorch_bin_and_old_names_load_like_safetensors(tmp_path, tiny_checkpoints):
    src = tiny_checkpoints["BertForPreTraining"]
    ref, tok = load(src)
    folder = _copy(src, tmp_path / "bin")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    # TF-era names and the position_ids buffer, as in old checkpoints
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    old["bert.embeddings.position_ids"] = torch.arange(64)[None]
    old["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    torch.save(old, folder / "pytorch_model.bin")
    model, _ = load(folder)
    ids, types = _ids(tok)
    with torch.no_grad():
        assert torch.equal(model(ids, types).mlm_logits, ref(ids, types).mlm_logits)


def test_save_pretrained_round_trips_and_transformers_loads_it(tmp_path, bare_default):
    import transformers

    model, tok = bare_default  # the encoder only
    with_heads = model.with_heads(["mlm", "nsp"]).eval()
    folder = save_pretrained(with_heads, tok, tmp_path / "saved")
    again, tok2 = load(folder)
    ids, types = _ids(tok2)
    hf = transformers.BertForPreTraining.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = again(ids, types)
        assert torch.equal(ours.mlm_logits, with_heads(ids, types).mlm_logits)
        theirs = hf(input_ids=ids, token_type_ids=types)
    assert float((ours.mlm_logits - theirs.prediction_logits).abs().max()) <= 1e-5
    assert float((ours.nsp_logits - theirs.seq_relationship_logits).abs().max()) <= 1e-5
    # encoder only: saved as HF's bare BertModel (no "bert." prefix)
    bare = save_pretrained(model, tok, tmp_path / "bare")
    assert not any(k.startswith("bert.") for k in load_file(str(bare / "model.safetensors")))
    assert json.loads((bare / "config.json").read_text())["architectures"] == ["BertModel"]
    assert load(bare)[0].config.hidden_size == 384


def test_missing_folder_and_file_and_config(tmp_path, tiny_checkpoints):
    with pytest.raises(CheckpointError, match="does not exist"):
        load("./no/such/folder")
    with pytest.raises(CheckpointError, match="is a file"):
        load(tiny_checkpoints["BertModel"] / "config.json")
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "noconf")
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load(folder)
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "noweights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no weights"):
        load(folder)


def test_truncated_and_corrupt_weights(tmp_path, tiny_checkpoints):
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "trunc")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors could not be read: it looks truncated or corrupt"):
        load(folder)
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin could not be read"):
        load(folder)


def test_wrong_shape_names_the_keys(tmp_path, tiny_checkpoints):
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "shape")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load(folder)
    msg = str(e.value)
    assert "model.safetensors does not fit its config.json" in msg
    assert "bert.encoder.layer.0.intermediate.dense.weight (file (64, 32), config (48, 32))" in msg


def test_missing_and_unexpected_keys_are_named(tmp_path, tiny_checkpoints):
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "keys")
    state = load_file(str(folder / "model.safetensors"))
    del state["encoder.layer.1.attention.self.query.weight"]
    state["encoder.layer.1.attention.self.extra"] = torch.zeros(3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weight\(s\) missing: bert\.encoder\.layer\.1\.attention\.self\."
                                              r"query\.weight; 1 unexpected weight\(s\): bert\.encoder\.layer\.1"):
        load(folder)


def test_non_bert_checkpoints(tmp_path, tiny_checkpoints):
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "gpt2")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported yet"):
        load(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 32,
                                                    "num_attention_heads": 4}))
    with pytest.raises(CheckpointError, match=r"'roberta' \(planned\)"):
        load(folder)
    # a BERT config over weights of something else
    shutil.copy(tiny_checkpoints["BertModel"] / "config.json", folder / "config.json")
    save_file({"transformer.h.0.attn.c_attn.weight": torch.zeros(4, 4)}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="holds no BERT encoder weights.*is it a BERT checkpoint"):
        load(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="could not be read as JSON"):
        load(folder)


def test_head_declared_but_absent_is_reported(tmp_path, tiny_checkpoints, caplog):
    folder = _copy(tiny_checkpoints["BertModel"], tmp_path / "pretend")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["BertForPreTraining"]
    (folder / "config.json").write_text(json.dumps(cfg))
    model, _ = load(folder)
    assert not model.has_mlm and model.load_report.missing_heads == ("mlm", "nsp")
    assert "has no MLM head although config.json names BertForPreTraining" in " ".join(model.load_report.notes)
