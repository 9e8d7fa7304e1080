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

from bertlab.loading import load, save_pretrained
from bertlab.weights import CheckpointError


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
        "from bertlab.weights import CheckpointError\n"
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
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "num_layers": 2}))
    with pytest.raises(CheckpointError, match="model_type 't5' is not supported yet"):
        load(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))  # a family, other weights
    with pytest.raises(CheckpointError, match="holds no GPT-2 encoder weights"):
        load(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 32,
                                                    "num_attention_heads": 4}))
    with pytest.raises(CheckpointError, match=r"model.safetensors does not fit its config.json.*roberta.encoder.layer"):
        load(folder)  # a RoBERTa config over BERT weights: named, not loaded
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


# -- shared weights: memory-mapped files, one copy per machine -----------------------------------
def _mappings(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, permissions) of this process's mappings of `path`."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and Path(parts[5]) == path:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[1]))
    return out


def _mapped_from(model, path: Path) -> list[str]:
    """Names of `model`'s weights whose memory lies in a mapping of `path`."""
    maps = _mappings(path)
    return [n for n, t in model.state_dict().items()
            if any(a <= t.untyped_storage().data_ptr() < b for a, b, _ in maps)]


def _reference_default(folder: Path):
    """The offline default as bertlab composed it before (a fresh model, the package's weights and the
    float16 heads copied in by load_state_dict), without the loader under test."""
    from bertlab.config import BertConfig
    from bertlab.families.bert import Bert
    from bertlab.loading import normalise_keys
    from bertlab.recipes.default_heads import heads_path

    heads = {k: v.float() for k, v in load_file(str(heads_path())).items()}
    state = {**normalise_keys(load_file(str(folder / "model.safetensors"))), **heads}
    config = BertConfig.from_json_file(folder / "config.json").replace(
        pretraining_heads=("mlm", "nsp"), add_pooler=True)
    ref = Bert(config)
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    ref.load_state_dict(state, strict=True)
    return ref.eval()


linux_only = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")


@linux_only
def test_default_is_mapped_from_one_composed_file_with_the_same_logits(tmp_path, monkeypatch, minilm_folder):
    from bertlab import loading
    from bertlab.recipes.default_heads import heads_path

    monkeypatch.setenv("HOME", str(tmp_path))
    model, tok = load()
    files = list((tmp_path / ".cache" / "bertlab" / "weights").glob("default-*.safetensors"))
    assert files == [loading.composed_default_path(minilm_folder, heads_path())]
    composed = files[0]
    # every weight is the file's memory (shared by every process that maps it), none a private copy
    assert _mapped_from(model, composed) == list(model.state_dict())
    assert all(perm[3] == "p" for _, _, perm in _mappings(composed))  # a private map: writes never reach the file
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert all(p.requires_grad for p in model.parameters()) and not model.training
    ref = _reference_default(minilm_folder)
    ids, types = _ids(tok)
    with torch.no_grad():
        ours, theirs = model(ids, types), ref(ids, types)
    assert float((ours.mlm_logits - theirs.mlm_logits).abs().max()) <= 1e-6
    assert float((ours.nsp_logits - theirs.nsp_logits).abs().max()) <= 1e-6
    # a second load maps the same file, untouched; writing to a weight changes this process's copy only
    written = composed.stat().st_mtime_ns
    again, _ = load()
    assert _mapped_from(again, composed) == list(again.state_dict()) and composed.stat().st_mtime_ns == written
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[2000:2010].add_(1.0)
        model.bert.encoder.layer[0].attention.self.query.weight.zero_()
    with torch.no_grad():
        assert torch.equal(again(ids, types).mlm_logits, theirs.mlm_logits)
    assert torch.equal(load_file(str(composed))["bert.encoder.layer.0.attention.self.query.weight"],
                       ref.bert.encoder.layer[0].attention.self.query.weight)


def test_loading_needs_no_compiler(tmp_path):
    """Building the model on the meta device used to fill it with random numbers first, which imports
    torch's compiler (torch._dynamo, sympy): memory and start-up time in every kernel for nothing."""
    code = ("import sys\nfrom bertlab.loading import load\nm, t = load()\n"
            "print(sorted(k for k in ('torch._dynamo', 'sympy') if k in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@linux_only
def test_composed_file_follows_the_heads_and_a_bad_one_is_rebuilt(tmp_path, monkeypatch, minilm_folder, caplog):
    from bertlab import loading
    from bertlab.recipes.default_heads import heads_path

    monkeypatch.setenv("HOME", str(tmp_path))
    heads = tmp_path / "heads.safetensors"
    shutil.copy(heads_path(), heads)
    monkeypatch.setenv("BERTLAB_DEFAULT_HEADS", str(heads))
    first, tok = load()
    old = loading.composed_default_path(minilm_folder, heads)
    assert old.is_file()
    # new heads (a retrained file): a new composed file, the old one removed
    state = {k: v.clone() for k, v in load_file(str(heads)).items()}  # not views of the file it overwrites
    state["cls.predictions.bias"] += 1
    save_file(state, str(heads))
    second, _ = load()
    new = loading.composed_default_path(minilm_folder, heads)
    assert new != old and new.is_file() and not old.exists()
    assert _mapped_from(second, new)
    assert torch.allclose(second.cls.predictions.bias, first.cls.predictions.bias + 1, atol=2e-3)  # a float16 file
    # a damaged file is never trusted: removed, the model loaded from the sources all the same
    expected = second.cls.predictions.bias.detach().clone()
    damaged = tmp_path / "damaged"
    damaged.write_bytes(b"\x00garbage" * 10)
    os.replace(damaged, new)  # a new file in its place (rewriting a mapped file in place would crash `second`)
    third, _ = load()
    assert torch.equal(third.cls.predictions.bias, expected)
    assert "unusable" in caplog.text and not new.exists()
    assert load()[0] is not None and new.is_file()  # and written again next time


def test_composed_default_loads_privately_when_the_cache_cannot_be_written(tmp_path, monkeypatch, minilm_folder):
    from bertlab import loading

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(loading, "weights_cache_dir", lambda: blocker / "weights")
    model, tok = load()
    ids, types = _ids(tok)
    with torch.no_grad():
        assert float((model(ids, types).mlm_logits - _reference_default(minilm_folder)(ids, types).mlm_logits)
                     .abs().max()) <= 1e-6


@linux_only
def test_hub_weights_are_mapped_and_a_local_folders_copied(tmp_path, monkeypatch, tiny_checkpoints):
    """Hub cache files are written once and never changed: shared. A local folder may be saved over while a
    model loaded from it lives, so its weights are copied (and save_pretrained replaces the file, never
    rewrites it)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-bert" / "snapshots" / commit
    shutil.copytree(tiny_checkpoints["BertForPreTraining"], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.file_download.HF_HUB_CACHE", str(tmp_path / "hub"), raising=False)
    from bertlab import loading

    assert loading._in_hub_cache(snapshot) and not loading._in_hub_cache(tiny_checkpoints["BertModel"])
    model, _ = loading.load_model(snapshot, share=loading._in_hub_cache(snapshot))
    assert _mapped_from(model, (snapshot / "model.safetensors").resolve()) == list(model.state_dict())

    folder = _copy(tiny_checkpoints["BertForPreTraining"], tmp_path / "local")
    local, tok = load(folder)
    assert _mapped_from(local, folder / "model.safetensors") == []
    ids, types = _ids(tok)
    with torch.no_grad():
        before = local(ids, types).mlm_logits.clone()
        other = local.with_heads(["mlm", "nsp"]).eval()
        other.bert.encoder.layer[0].output.dense.weight.mul_(3)
    save_pretrained(other, tok, folder)  # over the folder the first model came from
    with torch.no_grad():
        assert torch.equal(local(ids, types).mlm_logits, before)
        assert not torch.equal(load(folder)[0](ids, types).mlm_logits, before)


MAPPED_INODE = """
import os
from bertlab.loading import load
model, _ = load()
ptr = model.bert.embeddings.word_embeddings.weight.untyped_storage().data_ptr()
for line in open("/proc/self/maps"):
    parts = line.split()
    start, end = (int(x, 16) for x in parts[0].split("-"))
    if start <= ptr < end:
        print(parts[4], parts[5] if len(parts) > 5 else "")
"""


@linux_only
def test_kernels_starting_together_map_one_file(tmp_path):
    """Students arriving at once: the first process composes the file, the others wait for it and map
    the very same file (same inode), so the OS holds one copy of the weights."""
    env = {**os.environ, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", MAPPED_INODE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1000:] for _, err in outs]
    mapped = {out.strip() for out, _ in outs}
    files = list((tmp_path / ".cache" / "bertlab" / "weights").glob("default-*.safetensors"))
    assert len(files) == 1 and mapped == {f"{files[0].stat().st_ino} {files[0]}"}


def test_a_folder_named_by_the_environment_stands_in_for_the_model_package(tmp_path, monkeypatch, minilm_folder):
    """Embeddings alone in the folder: the heads file completes the default, and the package's own encoder
    (which needs its layers) says what is missing."""
    from bertlab.loading import default_model_folder

    folder = tmp_path / "minilm"
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_folder / name, folder / name)
    state = load_file(str(minilm_folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "embeddings." in k}, str(folder / "model.safetensors"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("BERTLAB_DEFAULT_MODEL_DIR", str(folder))
    assert default_model_folder() == folder
    model, tok = load()
    monkeypatch.delenv("BERTLAB_DEFAULT_MODEL_DIR")
    ref, _ = load()
    ids = tok.encode_batch(["the man went to the [MASK] store."])
    with torch.no_grad():
        assert torch.equal(model(ids.input_ids).mlm_logits, ref(ids.input_ids).mlm_logits)
    monkeypatch.setenv("BERTLAB_DEFAULT_MODEL_DIR", str(folder))
    with pytest.raises(CheckpointError, match="missing"):
        load("default-encoder")
    monkeypatch.setenv("BERTLAB_DEFAULT_MODEL_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointError, match="BERTLAB_DEFAULT_MODEL_DIR=.*no config.json"):
        default_model_folder()
