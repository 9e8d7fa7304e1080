"""Shared fixtures: tiny Hugging Face checkpoints written by transformers, the offline default,
the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TINY = dict(
    vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
)


def pytest_report_header(config) -> str:
    """Say which kind of CPU the suite runs on: `--precision auto` means bf16 where it is native."""
    from bertlab.training.loop import native_bf16

    return f"bertlab: this CPU {'has' if native_bf16(torch.device('cpu')) else 'has no'} native bf16"


def _hf_quiet():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    from bertlab.loading import default_model_folder

    return default_model_folder()


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory, minilm_folder) -> Path:
    """A 1000-word WordPiece vocab (specials + the first real pieces of bert-base-uncased)."""
    lines = (minilm_folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab = lines[:1000]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_vocab) -> dict[str, Path]:
    """Random tiny checkpoints saved by transformers' own save_pretrained, by architecture."""
    transformers = _hf_quiet()
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for i, arch in enumerate(["BertForPreTraining", "BertForMaskedLM", "BertModel", "BertForSequenceClassification",
                              "BertForTokenClassification", "BertForQuestionAnswering"]):
        torch.manual_seed(i)
        cfg = transformers.BertConfig(**TINY, num_labels=2 if arch.endswith("Answering") else 3)
        model = getattr(transformers, arch)(cfg).eval()
        folder = root / arch
        model.save_pretrained(folder)
        tok = transformers.BertTokenizerFast.from_pretrained(tiny_vocab.parent)
        tok.save_pretrained(folder)
        out[arch] = folder
    return out


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (small training runs are faster and steadier so on 2 cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tok(minilm_folder):
    """The offline default's tokenizer (bert-base-uncased vocabulary)."""
    from bertlab.tokenizer import Tokenizer

    return Tokenizer.from_folder(minilm_folder)


@pytest.fixture
def shared_data(monkeypatch) -> Path:
    """Points BERTLAB_DATA at ../shared/data; skips when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} not present")
    monkeypatch.setenv("BERTLAB_DATA", str(SHARED_DATA))
    return SHARED_DATA


@pytest.fixture(scope="session")
def default_model():
    """The offline default (MiniLM) and its tokenizer, loaded once per test session."""
    from bertlab.loading import load

    return load(None)


@pytest.fixture(scope="session")
def bare_default():
    """The offline default exactly as the package ships it: the encoder, no MLM/NSP head
    (what `load(None)` gives when bertlab's trained heads are switched off)."""
    from bertlab.loading import default_model_folder, load_model
    from bertlab.tokenizer import Tokenizer

    folder = default_model_folder()
    model, _ = load_model(folder)
    return model, Tokenizer.from_folder(folder)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built (offline) from its source distribution, as pip builds one
    it downloaded: what the sdist leaves out (MANIFEST.in: apps/, notebooks/) the wheel lacks."""
    import importlib.util
    import shutil
    import subprocess
    import sys
    import tarfile

    repo, out = Path(__file__).resolve().parents[1], tmp_path_factory.mktemp("wheel")
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(repo / name, src / name)
    for folder in ("bertlab", "apps", "notebooks"):
        shutil.copytree(repo / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    if importlib.util.find_spec("setuptools") is None:  # a venv without one builds in isolation (online)
        isolation, tree = [], src
    else:  # offline and quick with the venv's setuptools: sdist, then the wheel from the unpacked sdist
        make_sdist = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
        done = subprocess.run([sys.executable, "-c", make_sdist], cwd=src, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        with tarfile.open(out / done.stdout.split()[-1]) as sdist:
            sdist.extractall(out / "sdist", filter="data")
        isolation, (tree,) = ["--no-build-isolation"], list((out / "sdist").iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("*.whl")
    return built
