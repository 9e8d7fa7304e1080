"""The BERT paper's feature choices (feature-based NER): each choice's width and numbers against transformers'
hidden states, the scalar mix with fixed one-hot weights against the single-layer rows, a feature-based run
end to end (the encoder frozen, the head learns, the JSON says what it used), the CLI's refusals and the
Fine-tuning tab's feature choice. Tiny random BERTs on CPU, no timing (bench/feature_table.py's own test is in
test_bench_scripts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_finetune import write_conll
from tiny_models import tiny_bert

from bertlab.analysis.probe_data import TaggedSentence
from bertlab.loading import save_pretrained
from bertlab.tasks import encode_words
from bertlab.tasks.layer_features import FEATURES, LayerFeatures, feature_width, word_features
from bertlab.training.feature_head import HEAD_FILE, FeatureHead, run_finetune
from bertlab.training.finetune import FinetuneConfig, FinetuneError, finetune
from bertlab.training.finetune_defaults import recipe

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [TaggedSentence("Peter Blackburn flew to Lisbon on Monday .".split()),
             TaggedSentence("The European Commission said on Thursday it disagreed .".split())]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny4(tok):
    """A 4-layer tiny BERT: five stages, so every choice (the last four layers included) applies."""
    return tiny_bert(tok, seed=1, layers=4)


@pytest.fixture(scope="module")
def stages(tiny4, tok) -> list[torch.Tensor]:
    return word_features(tiny4, tok, SENTENCES, use_cache=False)  # per sentence [stage, words, d]


def _words(stages: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([f.transpose(0, 1) for f in stages])  # [words, stage, d]


def test_each_choice_has_its_width(stages):
    x = _words(stages)
    assert x.shape[1:] == (5, 32)
    for features in FEATURES:
        out = LayerFeatures(features, stages=5)(x)
        want = 4 * 32 if features == "concat-last-4" else 32
        assert out.shape == (len(x), want) == (len(x), feature_width(features, 32)), features
        assert FeatureHead(features, 5, 32, n_labels=9).classifier.in_features == want


def test_the_choices_read_the_right_hidden_states_of_transformers(tiny4, tok, stages, tmp_path):
    """embeddings = hidden_states[0], last = [-1], second-to-last = [-2], sum-last-4 = the sum of the last four
    and concat-last-4 = the four side by side, at each word's first piece (transformers as the reference)."""
    transformers = pytest.importorskip("transformers")
    save_pretrained(tiny4, tok, tmp_path / "tiny")
    ref = transformers.AutoModel.from_pretrained(tmp_path / "tiny").eval()
    x = _words(stages)
    firsts = []
    for s in SENTENCES:
        ids, word_ids = encode_words(s.words, tok, max_length=128)
        with torch.no_grad():
            hidden = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states  # 5 × [1, seq, d]
        first = [word_ids.index(w) for w in range(len(s.words))]
        firsts.append(torch.stack([h[0, first] for h in hidden], 1))  # [words, stage, d]
    h = torch.cat(firsts)
    want = {"embeddings": h[:, 0], "last": h[:, -1], "second-to-last": h[:, -2], "sum-last-4": h[:, 1:].sum(1),
            "concat-last-4": torch.cat([h[:, 1], h[:, 2], h[:, 3], h[:, 4]], -1)}
    for features, expected in want.items():
        torch.testing.assert_close(LayerFeatures(features, 5)(x), expected, rtol=0, atol=2e-2, msg=features)
    assert not torch.allclose(want["sum-last-4"], 4 * want["last"], atol=0.1)  # the four layers do differ


@pytest.mark.parametrize("stage, single", [(0, "embeddings"), (4, "last"), (3, "second-to-last")])
def test_mix_with_one_hot_weights_fixed_is_the_single_layer_row(stages, stage, single):
    x = _words(stages)
    fixed = torch.nn.functional.one_hot(torch.tensor(stage), 5).float()
    mixed = LayerFeatures("mix", 5, fixed=fixed)
    torch.testing.assert_close(mixed(x), LayerFeatures(single, 5)(x), rtol=0, atol=0)
    assert not any(p.requires_grad for p in mixed.parameters())  # nothing learns with fixed weights
    # and the whole head: the same linear map on top gives the same tag scores
    a, b = FeatureHead("mix", 5, 32, 9, fixed=fixed), FeatureHead(single, 5, 32, 9)
    b.classifier.load_state_dict(a.classifier.state_dict())
    torch.testing.assert_close(a(x), b(x))


def test_a_choice_the_model_is_too_shallow_for_is_refused(tok):
    with pytest.raises(ValueError, match="at least 4 layers"):
        LayerFeatures("sum-last-4", stages=3)
    with pytest.raises(ValueError, match="one of embeddings, last"):
        LayerFeatures("average", stages=5)


def test_a_feature_run_freezes_the_encoder_learns_the_head_and_says_what_it_used(tiny4, tok, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))
    data = write_conll(tmp_path / "conll", n_train=96, n_dev=32)
    before = {k: v.clone() for k, v in tiny4.state_dict().items()}
    cfg = FinetuneConfig(task="ner", mode="feature", features="mix", data=str(data), model=tiny4, lr=3e-2,
                         epochs=6, batch_size=16, out_dir=str(tmp_path / "out"))
    result = run_finetune(cfg, tokenizer=tok)
    assert result.status == "completed"
    assert all(torch.equal(before[k], v) for k, v in tiny4.state_dict().items())  # the encoder stays frozen
    losses = [h["loss"] for h in result.train.history if h.get("kind") == "train"]
    assert losses[-1] < losses[0] * 0.7
    assert result.score > 0.3  # the synthetic rule (names, places, firms) is learnable from the features
    summary = json.loads((tmp_path / "out" / "finetune_results.json").read_text())
    assert summary["features"] == "mix" and summary["head"] == "linear" and summary["mode"] == "feature"
    mix = summary["mix"]
    assert mix["layers"] == ["embeddings", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert len(mix["weights"]) == 5 and abs(sum(mix["weights"]) - 1) < 1e-3
    assert max(mix["weights"]) - min(mix["weights"]) > 1e-3  # learned, not left uniform
    assert summary["train_examples"] == 96 and summary["eval_examples"] == 32
    assert (tmp_path / "out" / HEAD_FILE).is_file()
    assert list((tmp_path / "cache" / "features").glob("*.pt"))  # features computed once, cached
    last = run_finetune(FinetuneConfig(task="ner", mode="feature", features="last", data=str(data), model=tiny4,
                                   epochs=1, batch_size=16), tokenizer=tok)
    assert last.summary()["mix"] is None and last.summary()["features"] == "last"
    with pytest.raises(FinetuneError, match="run_finetune"):  # the full-model engine does not take features
        finetune(cfg, tokenizer=tok)


def test_cancel_while_the_features_are_read_stops_before_training(tiny4, tok, tmp_path, monkeypatch):
    import threading

    from bertlab.tasks.layer_features import Cancelled

    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))
    cancel = threading.Event()
    cancel.set()
    cfg = FinetuneConfig(task="ner", mode="feature", features="last", data=str(write_conll(tmp_path / "c", 32, 8)),
                         model=tiny4, epochs=1, batch_size=8, out_dir=str(tmp_path / "out"))
    with pytest.raises(Cancelled):
        run_finetune(cfg, cancel=cancel, tokenizer=tok)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_the_feature_head_defaults_are_the_tables_train_only_choice():
    """`--features` without --lr/--epochs trains with what bench/feature_table.py chose on train data alone,
    and the table's feature rows ran with exactly that."""
    d = json.loads((ROOT / "bench" / "results" / "feature_table.json").read_text(encoding="utf-8"))
    head = recipe("ner", "feature", "mix")
    assert (head.lr, head.epochs) == (d["head_choice"]["lr"], d["head_choice"]["epochs"])
    assert all((r["lr"], r["epochs"]) == (head.lr, head.epochs) for r in d["rows"] if r["mode"] == "feature")
    cfg = FinetuneConfig(task="ner", mode="feature", features="last").resolved()
    assert (cfg.lr, cfg.epochs, cfg.batch_size) == (head.lr, head.epochs, head.batch_size)
    own = FinetuneConfig(task="ner", mode="feature").resolved()  # the model's own head: as before
    assert (own.lr, own.epochs) == (recipe("ner", "feature").lr, recipe("ner", "feature").epochs) != (head.lr,
                                                                                                   head.epochs)


def _cli(*argv: str) -> int:
    from bertlab.cli import main

    return main(list(argv))


def test_the_cli_refuses_features_without_feature_mode(tmp_path, capsys):
    assert _cli("finetune", "--task", "ner", "--out", str(tmp_path / "o"), "--features", "last") == 1
    err = capsys.readouterr().err
    assert "need mode 'feature' (--mode feature)" in err and "Traceback" not in err
    assert _cli("finetune", "--task", "sst2", "--mode", "feature", "--out", str(tmp_path / "o"), "--features",
                "mix") == 1
    assert "use them with the ner task" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_cli_passes_features_and_leaves_the_default_alone():
    import argparse

    from bertlab.training.finetune_cli import add_finetune_parser, config_from_args

    p = argparse.ArgumentParser()
    add_finetune_parser(p.add_subparsers())
    cfg = config_from_args(p.parse_args(["finetune", "--task", "ner", "--out", "o", "--mode", "feature",
                                         "--features", "concat-last-4"]))
    assert (cfg.mode, cfg.features) == ("feature", "concat-last-4")
    assert config_from_args(p.parse_args(["finetune", "--task", "ner", "--out", "o", "--mode", "feature"])
                            ).features is None


def test_the_fine_tuning_tab_offers_the_choices_in_feature_mode_and_plots_the_mix(tiny4, tok, tmp_path,
                                                                                  monkeypatch):
    from bertlab.panels.finetune import OWN_HEAD, FinetunePanel

    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))
    panel = FinetunePanel(tiny4, tok, runs_dir=tmp_path / "runs", device="cpu")
    made: list = []
    panel.model_made = lambda name, m, t: made.append(name)
    shown = lambda: panel.features_box.layout.display != "none"  # noqa: E731
    panel.task.value = "ner"
    assert not shown()  # full mode: no feature choice
    panel.mode.value = "feature"
    assert shown() and [v for _, v in panel.features.options] == [OWN_HEAD, *FEATURES]
    assert panel.features.value == OWN_HEAD and panel.chosen_features() is None  # the default: as before
    panel.task.value = "sst2"
    assert not shown()
    panel.task.value = "ner"
    own = (panel.lr.value, panel.epochs.value)
    panel.features.value = "mix"
    head = recipe("ner", "feature", "mix")
    assert (panel.lr.value, panel.epochs.value) == (head.lr, head.epochs) != own  # the head's own defaults
    panel.path.value = str(write_conll(tmp_path / "conll", n_train=96, n_dev=32))
    panel.max_train.value, panel.max_dev.value, panel.epochs.value = 96, 32, 6
    panel.batch.value, panel.max_length.value, panel.lr.value = 16, 64, 3e-2
    panel.start_button.click()
    assert panel.job.wait(120)
    run = panel.runs[-1]
    assert (run.label, run.status, run.features) == ("ner · feature (mix)", "completed", "mix")
    assert run.summary["features"] == "mix" and run.score is not None
    fig = panel.figures()["scalar mix weights"]
    bars = fig.data[0]
    assert list(bars.x) == ["embeddings", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert abs(sum(bars.y) - 1) < 1e-3 and bars.y == tuple(run.summary["mix"]["weights"])
    assert "ner · feature (mix)" in fig.layout.title.text and "4 layers" in fig.layout.title.text
    assert panel.mix_box.children and made == []  # a head on features does not join the model list
    assert "the encoder stayed frozen" in " ".join(text for _, text in panel.messages)
