"""`bertlab probe` and `bertlab patch`: one JSON line each, errors as one line."""

from __future__ import annotations

import json

import pytest

from bertlab.cli import main

CLEAN = "When John and Mary went to the store, Mary gave a drink to [MASK]."
CORRUPT = "When John and Mary went to the store, John gave a drink to [MASK]."


def _json(capsys) -> dict:
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == 1
    return json.loads(lines[0])


def test_patch(capsys, default_model):
    assert main(["patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "john", "--wrong", "mary"]) == 0
    out = _json(capsys)
    assert out["layers"][0] == "embeddings" and len(out["recovery"]) == len(out["layers"])
    assert len(out["recovery"][0]) == len(out["tokens"])
    word = out["tokens"].index("mary", 5)
    assert out["recovery"][0][word] == pytest.approx(1.0, abs=1e-3)
    assert out["clean_diff"] != out["corrupt_diff"]


def test_patch_refuses_pairs_of_different_length(capsys, default_model):
    assert main(["patch", "--clean", CLEAN, "--corrupt", CORRUPT.replace("John gave", "Johnathan gave"),
                 "--answer", "john", "--wrong", "mary"]) == 1
    err = capsys.readouterr().err
    assert "same number of pieces" in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def small_files(tmp_path):
    from bertlab.settings import data_dir

    conll, ud = data_dir() / "conll2003" / "train.txt", data_dir() / "ud_ewt" / "en_ewt-ud-dev.conllu"
    if not conll.is_file() or not ud.is_file():
        pytest.skip("the shared data (BERTLAB_DATA) is not present")
    return conll, ud


def test_probe_pos_with_control(capsys, default_model, small_files, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path))
    conll, _ = small_files
    assert main(["probe", "--property", "pos", "--train", str(conll), "--max-train-sentences", "40",
                 "--max-eval-sentences", "20", "--control"]) == 0
    out = _json(capsys)
    assert out["property"] == "pos" and out["layers"][0] == "embeddings"
    assert len(out["accuracy"]) == len(out["control_accuracy"]) == len(out["selectivity"]) == len(out["layers"])
    assert set(out["mix"]) >= {"weights", "accuracy"} and len(out["mix"]["weights"]) == len(out["layers"])
    assert out["train_sentences"] == 40 and out["eval_sentences"] == 20


def test_probe_tree(capsys, default_model, small_files, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path))
    _, ud = small_files
    assert main(["probe", "--property", "tree", "--train", str(ud), "--eval", str(ud), "--max-train-sentences", "30",
                 "--max-eval-sentences", "10"]) == 0
    out = _json(capsys)
    assert out["property"] == "tree" and len(out["spearman"]) == len(out["accuracy"]) == len(out["layers"])


def test_probe_wrong_format_is_one_line(capsys, small_files):
    conll, _ = small_files
    assert main(["probe", "--property", "upos", "--train", str(conll)]) == 1
    err = capsys.readouterr().err.strip()
    assert "CoNLL-U" in err and len(err.splitlines()) == 1
