"""The hub path for real: huggingface_hub downloads from a Hugging Face-compatible endpoint on
loopback (tests/fake_hub.py) that serves a tiny checkpoint written by transformers; `bertlab
download` fills the cache, then `bertlab.load(NAME)` works offline; the picker shows size and progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from fake_hub import FakeHub
from tiny_models import deberta_hub_folder, family_folder

REPO = "tinylab/roberta-tiny"


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory):
    """A tiny RoBERTa folder as the hub holds it, with files bertlab must not download."""
    folder = family_folder(tmp_path_factory.mktemp("hub"), "roberta")
    (folder / "tf_model.h5").write_bytes(b"\0" * 5000)  # TF weights: never downloaded
    (folder / "README.md").write_text("# a tiny model\n")
    return folder


def _env(tmp_path, endpoint: str | None, offline: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", HF_HUB_DISABLE_TELEMETRY="1")
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _bertlab(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import sys; from bertlab.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def test_download_fills_the_cache_then_load_works_offline(hub_folder, tmp_path):
    with FakeHub({REPO: hub_folder}) as hub:
        done = _bertlab(["download", REPO], _env(tmp_path, hub.endpoint, offline=False))
        assert done.returncode == 0, done.stderr
        asked = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert f"{REPO}:" in done.stdout and "kB" in done.stdout
    assert not any(r.endswith(("tf_model.h5", "README.md")) for r in asked)  # only what bertlab reads
    snapshots = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    (snapshot,) = snapshots.iterdir()
    read = {"config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(read & {p.name for p in hub_folder.iterdir()})
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in snapshot.iterdir()}

    # The server is gone and the hub is off: the model comes from the cache, equal to the folder it was made from.
    code = ("import json, sys, torch, bertlab; m, t = bertlab.load(sys.argv[1]); e = t.encode('the quick <mask> fox');"
            "out = m(torch.tensor([e.ids])); print(json.dumps([t.mask_token, out.mlm_logits[0, 1, :5].tolist()]))")
    runs = [subprocess.run([sys.executable, "-c", code, REPO], env=env, capture_output=True, text=True, timeout=120)
            for env in (_env(tmp_path, None, offline=True),  # HF_HUB_OFFLINE=1
                        _env(tmp_path, hub.endpoint, offline=False))]  # or a hub that no longer answers
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-500:] for r in runs]
    mask, logits = json.loads(runs[0].stdout.strip().splitlines()[-1])
    assert json.loads(runs[1].stdout.strip().splitlines()[-1]) == [mask, logits]
    import bertlab

    model, tok = bertlab.load(str(hub_folder))
    ref = model(torch.tensor([tok.encode("the quick <mask> fox").ids])).mlm_logits[0, 1, :5]
    assert mask == "<mask>"
    torch.testing.assert_close(torch.tensor(logits), ref, atol=1e-5, rtol=0)


def test_download_errors_are_one_line_each(hub_folder, tmp_path):
    with FakeHub({REPO: hub_folder}) as hub:
        done = _bertlab(["download", "nobody/no-such-model", "not a name!", REPO],
                        _env(tmp_path, hub.endpoint, offline=False))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1
    assert lines == [
        "bertlab download: no model named nobody/no-such-model on the Hugging Face hub (check the spelling).",
        "bertlab download: 'not a name!' is not a hub model name (like bert-base-uncased or "
        "google/electra-small-generator).",
    ], done.stderr
    assert f"{REPO}:" in done.stdout  # the good one was still downloaded
    offline = _bertlab(["download", "other/model"], _env(tmp_path, None, offline=True))
    assert offline.returncode == 1
    assert len(offline.stderr.strip().splitlines()) == 1
    assert "offline" in offline.stderr and "Traceback" not in offline.stderr


def test_needed_files_keep_one_set_of_weights():
    from bertlab.hub import HubFile, needed_files

    files = [HubFile(n, 1) for n in ("config.json", "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
                                     "model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack",
                                     "onnx/model.onnx", "tokenizer_config.json")]
    assert [f.name for f in needed_files(files)] == ["config.json", "tokenizer.json", "tokenizer_config.json",
                                                      "model.safetensors"]
    sharded = [HubFile(n, 1) for n in ("config.json", "vocab.txt", "model.safetensors.index.json",
                                       "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                       "pytorch_model.bin")]
    assert [f.name for f in needed_files(sharded)] == [
        "config.json", "vocab.txt", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors"]
    assert [f.name for f in needed_files([HubFile("config.json", 1), HubFile("pytorch_model.bin", 1)])] == [
        "config.json", "pytorch_model.bin"]
    deberta = [HubFile(n, 1) for n in ("config.json", "pytorch_model.bin", "rust_model.ot", "spm.model",
                                       "tf_model.h5", "tokenizer_config.json")]  # microsoft/deberta-v3-base
    assert [f.name for f in needed_files(deberta)] == ["config.json", "spm.model", "tokenizer_config.json",
                                                        "pytorch_model.bin"]
    with_json = [*deberta, HubFile("tokenizer.json", 1)]  # spm.model is then not read
    assert [f.name for f in needed_files(with_json)] == ["config.json", "tokenizer.json", "tokenizer_config.json",
                                                          "pytorch_model.bin"]


def test_deberta_v3_hub_layout_downloads_and_loads_offline(tmp_path):
    """A repository laid out as microsoft/deberta-v3-* are (pytorch_model.bin with heads transformers leaves
    unread, spm.model, no architectures): downloaded, then loaded offline; equal to transformers."""
    import transformers

    repo = "tinylab/deberta-v3-tiny"
    folder = deberta_hub_folder(tmp_path / "repo")
    with FakeHub({repo: folder}) as hub:
        done = _bertlab(["download", repo], _env(tmp_path, hub.endpoint, offline=False))
    assert done.returncode == 0, done.stderr
    (snapshot,) = (tmp_path / "hf" / "hub" / "models--tinylab--deberta-v3-tiny" / "snapshots").iterdir()
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "pytorch_model.bin", "spm.model",
                                                         "tokenizer_config.json"]
    import bertlab

    model, tok = bertlab.load(str(snapshot))
    assert model.family.name == "deberta-v2" and model.has_mlm and model.has_rtd and not model.family.has_segments
    text = f"the quick {tok.mask_token} fox"
    ref_tok = transformers.AutoTokenizer.from_pretrained(snapshot)
    enc = tok.encode(text, "jumps")
    assert enc.ids == ref_tok(text, "jumps")["input_ids"]
    ids = torch.tensor([enc.ids])
    ref = transformers.DebertaV2Model.from_pretrained(snapshot).eval()
    with torch.no_grad():
        ours = model(ids, torch.tensor([enc.type_ids])).last_hidden_state
        theirs = ref(input_ids=ids, token_type_ids=torch.tensor([enc.type_ids])).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    from bertlab.analysis.replaced import replaced_tokens  # the detector the hub file carries, in the lab

    assert len(replaced_tokens(model, tok, "the quick brown fox jumps").tokens) == len(tok.encode("the quick brown "
                                                                                                  "fox jumps"))


# -- the picker: recommended models, size, progress, class mode --------------------------------
@pytest.fixture
def local_hub(hub_folder, tmp_path, monkeypatch):
    """The loopback hub, with huggingface_hub pointed at it in this process (cache in tmp_path)."""
    from huggingface_hub import constants

    from bertlab import hub as bhub

    with FakeHub({REPO: hub_folder}) as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            fake.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(bhub, "RECOMMENDED", (*bhub.RECOMMENDED, bhub.HubModel(REPO, "a tiny RoBERTa")))
        yield fake


@pytest.fixture
def picker_state(tmp_path):
    import bertlab
    from bertlab.panels.state import ModelState

    model, tok = bertlab.load(str(family_folder(tmp_path / "start", "bert")))
    return ModelState(model, tok, name="tiny bert")


def _wait_for(check, timeout=30.0):
    import time

    end = time.monotonic() + timeout
    while not check() and time.monotonic() < end:
        time.sleep(0.05)
    return check()


def test_picker_lists_recommended_models_and_downloads_with_progress(local_hub, picker_state):
    from bertlab.hub import RECOMMENDED
    from bertlab.panels.picker import ModelPicker
    from bertlab.workspace import Workspace

    picker = ModelPicker(picker_state, workspace=Workspace(None))
    names = [v for _, v in picker.hub_choice.options]
    for name in ("bert-base-uncased", "roberta-base", "albert-base-v2", "distilbert-base-uncased",
                 "google/electra-small-discriminator", "google/electra-small-generator",
                 "SpanBERT/spanbert-base-cased", "google/bert_uncased_L-4_H-256_A-4", "microsoft/deberta-v3-small",
                 "microsoft/deberta-v3-base"):
        assert name in names
    assert len(names) == len(RECOMMENDED) + 1

    picker.hub_choice.value = REPO
    assert _wait_for(lambda: "to download" in picker.hub_info.value)
    read = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    size = sum(len(data) for name, data in local_hub.repos[REPO].items() if name in read)
    from bertlab.hub import human_size

    assert human_size(size) in picker.hub_info.value
    seen: list[float] = []
    picker.progress.observe(lambda c: seen.append(c["new"]), names="value")
    busy: list[str] = []
    picker.hub_info.observe(lambda c: busy.append(c["new"]), names="value")
    picker.get_button.click()
    assert picker.download.wait(60)
    assert picker_state.name == REPO and picker_state.model.family.name == "roberta"
    assert "Something went wrong" not in picker.message.value
    assert "every tab now shows it" in picker.message.value
    assert seen and seen[-1] == size and seen == sorted(seen) and picker.progress.max == size
    assert any("bertlab-busy" in b and "Downloading" in b for b in busy)
    assert REPO in picker.choice.options
    assert any(label.startswith(REPO) and "cached" in label for label, _ in picker.hub_choice.options)


def test_class_mode_picker_offers_only_cached_models(local_hub, picker_state, tmp_path, monkeypatch):
    from bertlab.panels.picker import ModelPicker
    from bertlab.workspace import Workspace

    monkeypatch.setenv("BERTLAB_CLASS", "1")
    picker = ModelPicker(picker_state, workspace=Workspace.new(tmp_path / "ws"))
    assert picker.workspace.confined
    picker.hub_choice.value = REPO
    assert picker.get_button.disabled and "ask your teacher" in picker.hub_info.value
    picker._on_get()  # even if the button were pressed: nothing is downloaded
    assert not any("/resolve/" in r for r in local_hub.requests)

    from bertlab import hub

    hub.download(REPO)  # the teacher fills the cache (bertlab download)
    requests = len(local_hub.requests)
    picker = ModelPicker(picker_state, workspace=Workspace.new(tmp_path / "ws"))
    assert any(label.startswith(REPO) and "cached" in label for label, _ in picker.hub_choice.options)
    picker.hub_choice.value = REPO
    read = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    size = hub.human_size(sum(len(d) for n, d in local_hub.repos[REPO].items() if n in read))
    assert not picker.get_button.disabled and f"cache ({size})" in picker.hub_info.value
    picker.get_button.click()
    assert picker.download.wait(60)
    assert picker_state.name == REPO, picker.message.value
    assert len(local_hub.requests) == requests or all("/resolve/" not in r for r in local_hub.requests[requests:])


def test_download_without_names_says_what_to_type(capsys):
    from bertlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["download"])
    assert info.value.code == 1
    assert capsys.readouterr().err.strip() == (
        "bertlab: name at least one hub model (e.g. bertlab download bert-base-uncased), or --recommended.")
