"""The Pre-training tab, without a browser: an objective chosen in the tab trains
its own model, the model is written to the run folder, joins the picker, can be downloaded, and the
session's runs share one comparison plot and a "fine-tune each on SST-2" button."""

from __future__ import annotations

import base64
import io
import zipfile
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.panels import pretrain as pretrain_panel
from bertlab.panels.pretrain import FALLBACK_DOCUMENTS, PretrainPanel
from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives import get_objective
from bertlab.training.pretrain import new_model

WORDS = "cat dog bird fish tree house river road car boat city park garden good bad great awful movie".split()


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("vocab")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "the", "a", "saw", "near", "is", "was", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    docs = []
    for d in range(24):
        lines = [f"The {WORDS[(d + s) % 13]} saw a {WORDS[(2 * d + s) % 13]} near the {WORDS[(d * s) % 13]}."
                 for s in range(8)]
        docs.append(" ".join(lines))
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sst2")
    good = ["a good movie", "a great movie", "the movie was good", "great city park"]
    bad = ["a bad movie", "an awful movie", "the movie was bad", "awful road"]
    rows = [f"{t}\t1" for t in good] + [f"{t}\t0" for t in bad]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows * 4) + "\n", encoding="utf-8")
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def panel(small_tok, corpus, sst2, tmp_path) -> PretrainPanel:
    torch.manual_seed(0)
    p = PretrainPanel(new_model("tiny", small_tok), small_tok, text="the cat saw a dog .",
                      probe="the cat saw a [MASK] .", pair_documents=FALLBACK_DOCUMENTS)
    p.runs_dir = tmp_path / "runs"
    p.corpus_path.value = str(corpus)
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value = "tiny", 4, 4, 32
    p.compare.sst2_dir, p.compare.sst2_train, p.compare.sst2_dev = sst2, 16, 8
    p.made = []
    p.model_made = lambda name, model, tok: p.made.append((name, model, tok))
    yield p
    p.stop_run()
    p.job.wait(60)
    p.compare.job.wait(60)


def _run(p: PretrainPanel, objective: str) -> None:
    p.objective.value = objective
    p.steps.value, p.batch.value, p.seq_len.value = 4, 4, 32  # a next-token objective set its lesson's run
    p.start.click()
    assert p.job.wait(120)
    assert p.result is not None and p.result.status == "completed", p.run_messages


def test_an_objective_run_is_kept_joins_the_picker_and_the_comparison(panel, one_thread):
    p = panel
    p.objective.value = "electra"
    assert p.train_strategy.disabled and p.pair_task.disabled and p.pair_task.value == "none"
    assert not p.embedding_size.disabled and p.shared_layers.disabled
    p.embedding_size.value = 64
    _run(p, "electra")
    (name, model, tok), = p.made
    assert name == "mini ELECTRA (tiny, 4 steps)" and model.config.model_type == "electra" and model.has_rtd
    assert model.config.embedding_size == 64
    level, text = p.run_messages[-1]
    assert level == "info" and "joined the model picker" in text and "Saved in" in text
    folder = p.last_run.folder
    assert folder.is_relative_to(p.runs_dir) and (folder / "generator" / "config.json").is_file()
    again, _ = bertlab.load(folder)  # the kept model is the discriminator, on disk
    assert again.config.pretraining_heads == ("rtd",)
    assert len(p.curves.data[0].x) == len(p.points) > 0  # the generator's MLM loss fills the live curve

    _run(p, "albert")
    assert p.made[-1][1].config.model_type == "albert" and p.made[-1][1].config.num_hidden_groups == 1
    assert [r.objective for r in p.compare.runs] == ["electra", "albert"]
    names = {t.name.lower() for t in p.compare.figure.data}
    assert any("electra" in n for n in names) and any("albert" in n for n in names)
    assert len(p.compare.figure.data) == 6  # own loss, MLM accuracy and probe for each run
    assert "objectives compared" in p.figures()

    p.download.click()  # the last kept model, as the Export tab does it: a data: URL
    href = p.download_link.value.split('href="', 1)[1].split('"', 1)[0]
    assert href.startswith("data:application/") and ";base64," in href
    last = p.last_run.folder  # the ALBERT's
    assert f'download="{last.parent.name}.zip"' in p.download_link.value
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))) as z:
        assert "model/config.json" in z.namelist() and "model/pretraining_objective.json" in z.namelist()

    p.compare.finetune.click()  # the same small SST-2 fine-tuning for each, scored on held-out sentences
    assert p.compare.job.wait(180)
    assert all(0.0 <= r.score["accuracy"] <= 1.0 for r in p.compare.runs), p.compare.messages
    assert all(0.0 <= r.probe["accuracy"] <= 1.0 for r in p.compare.runs)  # the linear probe beside it
    floor = p.compare.untrained  # the same scores for an untrained model of the first run's shape
    assert floor is not None and floor.name.startswith("untrained") and floor.score and floor.probe, p.compare.messages
    assert p.compare.messages[-1][0] == "info" and "%" in p.compare.scores.value
    assert "linear probe" in p.compare.scores.value and "untrained" in p.compare.scores.value


def test_the_own_mix_still_runs_and_a_missing_sst2_is_a_message(panel, tmp_path, one_thread):
    p = panel
    p.objective.value = "albert"
    p.objective.value = ""  # back to your own mix: masking and pair task free again
    assert not p.train_strategy.disabled and p.embedding_size.disabled
    _run(p, "")
    assert p.made[-1][0] == "mini BERT (tiny, 4 steps)" and p.compare.runs[-1].objective == "your mix"
    p.compare.sst2_dir = tmp_path / "nowhere"
    p.compare.finetune.click()
    assert p.compare.job.wait(60)
    level, text = p.compare.messages[-1]
    assert level == "error" and "BERTLAB_DATA" in text and not p.compare.finetune.disabled


def test_peek_says_why_bert_masks_and_its_run_shows_next_token_curves_and_attention(panel, one_thread):
    from bertlab.viz import pretrain_words as words

    p = panel
    p.objective.value = "peek"
    assert "why BERT masks" in p.objective_note.value and p.pair_task.value == "none"
    lesson = get_objective("peek").lesson  # a run long enough to find the shortcut, short enough for a lesson
    assert (p.steps.value, p.batch.value, p.seq_len.value) == (lesson["steps"], lesson["batch_size"], lesson["seq_len"])
    assert "Set for a lesson" in p.objective_note.value and pretrain_panel.lesson_lr("peek") == {"lr": lesson["lr"]}
    assert get_objective("causal").lesson == lesson  # the causal run it is set beside takes the same settings
    _run(p, "peek")
    (name, model, _), = p.made
    assert name.startswith("mini Peek") and model.config.predicts_next and not model.config.is_decoder
    assert {a.text for a in p.curves.layout.annotations} >= {"next-token loss", "next-token accuracy"}
    assert "next-token loss" in p.curves.data[0].hovertemplate
    assert len(p.curves.data[0].x) == len(p.points) > 0 and p.points[-1]["mlm_loss"] is not None
    assert words.NEXT_TOKEN_PROBE in p.probe_html.value and not p.probe_rows  # no masked word to probe
    assert p.run_messages[-1] == ("info", get_objective("peek").ended) and "why BERT masks" in p.run_messages[-1][1]
    again, _ = bertlab.load(p.last_run.folder)
    assert again.family.title == "BERT" and again.config.predicts_next
    from bertlab.viz.picker import model_card  # its card names the head for what it guesses

    card = model_card(again, "peek")
    assert "✓ next-word head (reads both ways" in card and "✗ MLM head" in card
    frame = p.replay.result.frames[-1]  # Replay reads the run's snapshots: their attention, no Mask view
    assert frame.attention.patterns.shape[0] == model.config.num_hidden_layers and frame.mask is None
    assert any("next token" in n for n in p.replay.result.notes)

    p.objective.value = "causal"
    assert "left" in p.objective_note.value
    _run(p, "causal")
    assert p.run.config.lr == lesson["lr"]
    patterns = p.replay.result.frames[-1].attention.patterns  # [layer, head, query, key]: nothing to the right
    n = patterns.shape[-1]
    assert float(torch.as_tensor(patterns)[..., ~torch.ones(n, n, dtype=torch.bool).tril()].abs().max()) == 0.0


def test_elmo_shows_in_the_picker_trains_two_directions_and_keeps_both(panel, one_thread):
    from bertlab.training.objectives.elmo import BACKWARD_FOLDER, ELMO_FILE, load_elmo

    p = panel
    assert "elmo" in [value for _, value in p.objective.options]
    p.objective.value = "elmo"
    assert "shallowly bidirectional" in p.objective_note.value and "LSTM" in p.objective_note.value
    _run(p, "elmo")
    (name, model, _), = p.made
    assert name.startswith("mini ELMo") and model.config.is_decoder  # the forward model joins the picker
    assert {a.text for a in p.curves.layout.annotations} >= {"next-token loss", "next-token accuracy"}
    assert len(p.curves.data[0].x) == len(p.points) > 0 and p.points[-1]["mlm_loss"] is not None
    assert p.run_messages[-1] == ("info", get_objective("elmo").ended) and BACKWARD_FOLDER in p.run_messages[-1][1]
    folder = p.last_run.folder
    assert (folder / ELMO_FILE).is_file() and (folder / BACKWARD_FOLDER / "config.json").is_file()
    fwd, bwd, _ = load_elmo(folder)
    assert fwd.config.is_decoder and bwd.config.is_decoder
