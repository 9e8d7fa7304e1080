"""Pre-training tab without a browser: one example masked as BERT sees it (checked against
`mask_tokens` itself), strategies side by side, sentence pairs, and short pre-training runs driven
through the panel's buttons in its background thread (tiny vocabulary, tiny corpus: fast on CPU)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from bertlab.analysis.mask import fill_mask
from bertlab.panels.pretrain import DEFAULT_TEXT, FALLBACK_DOCUMENTS, PretrainPanel
from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import Document, documents_for_run
from bertlab.training.masking import (
    MaskKind,
    mask_tokens,
    never_mask_ids,
    reserved_ids,
    word_starts_from_ids,
)
from bertlab.training.pretrain import new_model
from bertlab.training.preview import example_pairs, mask_every_strategy, mask_example
from bertlab.viz.pretrain import masked_example_html, plot_pretrain_curves
from bertlab.viz.pretrain_words import progress_text

KIND = {"none": MaskKind.NOT_CHOSEN, "mask": MaskKind.MASK, "random": MaskKind.RANDOM, "kept": MaskKind.KEPT}
WORDS = ("cat dog bird fish tree house river road car boat city park garden school market farm "  # noqa: SIM905
         "red blue green small big old new quiet happy").split()


def kinds_in(html: str) -> list[MaskKind]:
    return [KIND[k] for k in re.findall(r'class="bl-tok" data-kind="(\w+)"', html)]


def corpus_text(num_docs: int = 30, sentences: int = 8) -> str:
    """Documents of simple sentences over WORDS, a blank line between documents."""
    docs = []
    for d in range(num_docs):
        lines = []
        for s in range(sentences):
            a, b, c = (WORDS[(d * 7 + s * 3 + k * 5) % len(WORDS)] for k in range(3))
            lines.append(f"The {a} saw a {b} near the {c}.")
        docs.append(" ".join(lines))
    return "\n\n".join(docs)


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory) -> Tokenizer:
    """A WordPiece vocabulary of the corpus words: pre-training on it takes a fraction of a second per step."""
    folder = tmp_path_factory.mktemp("small_vocab")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "the", "a", "saw", "near", "is", "of", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


@pytest.fixture
def panel(default_model) -> PretrainPanel:
    model, tok = default_model
    return PretrainPanel(model, tok, pair_documents=FALLBACK_DOCUMENTS)


@pytest.fixture
def train_panel(small_tok, corpus) -> PretrainPanel:
    """A panel on the small vocabulary, set up for a quick run on the tiny corpus."""
    p = PretrainPanel(new_model("tiny", small_tok), small_tok, text="the cat saw a dog .",
                      probe="the cat saw a [MASK] .", pair_documents=FALLBACK_DOCUMENTS)
    p.corpus_path.value = str(corpus)
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value = "tiny", 8, 4, 32
    p.probe_every.value = 3
    p.made = []
    p.model_made = lambda name, model, tok: p.made.append((name, model, tok))
    yield p
    p.stop_run()
    p.job.wait(60)


# -- one example, as BERT sees it --------------------------------------------------------------
def test_masked_html_marks_each_position_as_mask_tokens_chose(default_model):
    _, tok = default_model
    seed, rate = 3, 0.5  # half the tokens: every case shows up
    ex = mask_example(tok, DEFAULT_TEXT, "token", rate, seed)
    # mask_tokens called directly, as the training collator calls it
    ids = torch.tensor([tok.encode(DEFAULT_TEXT).ids])
    out = mask_tokens(ids, torch.isin(ids, torch.tensor(never_mask_ids(tok))), tok.vocab_size, tok.mask_token_id,
                      torch.Generator().manual_seed(seed), word_starts=word_starts_from_ids(ids, tok),
                      mlm_probability=rate, exclude_from_random=reserved_ids(tok))
    want = [MaskKind(int(k)) for k in out.kind[0]]
    html = masked_example_html(ex)
    assert kinds_in(html) == want == ex.kinds
    assert {MaskKind.MASK, MaskKind.RANDOM, MaskKind.KEPT} <= set(want)
    assert ex.masked == tok.convert_ids_to_tokens(out.input_ids[0].tolist())
    for i, kind in enumerate(want):
        if kind == MaskKind.MASK:
            assert ex.masked[i] == "[MASK]"
        elif kind == MaskKind.KEPT:
            assert ex.masked[i] == ex.tokens[i]
        elif kind == MaskKind.RANDOM:
            assert ex.masked[i] != "[MASK]"
    # labels: the original piece where chosen, nothing elsewhere
    assert ex.labels == [t if k != MaskKind.NOT_CHOSEN else None for t, k in zip(ex.tokens, want)]
    assert ex.num_chosen == round(rate * (len(ids[0]) - 2))
    for name, kind in (("mask", MaskKind.MASK), ("random", MaskKind.RANDOM), ("kept", MaskKind.KEPT)):
        assert f'data-count="{name}">{want.count(kind)}<' in html


def test_panel_opens_on_the_default_with_all_three_cases(panel):
    assert panel.messages == []
    kinds = kinds_in(panel.example_html.value)
    assert len(kinds) == len(panel.tok.encode(DEFAULT_TEXT).ids)
    assert {MaskKind.MASK, MaskKind.RANDOM, MaskKind.KEPT} <= set(kinds)
    assert panel.example.num_chosen == round(0.15 * (len(kinds) - 2))
    assert panel.strategies_html.value.count('class="bl-strategy"') == 5  # the default text is tagged
    assert panel.dynamic_html.value.count('class="bl-epoch"') == 3
    assert panel.figures() == {}  # no run yet


def test_strategies_differ_and_keep_their_units(default_model):
    _, tok = default_model
    by = mask_every_strategy(tok, DEFAULT_TEXT, 0.3, seed=0)
    chosen = {s: [k != MaskKind.NOT_CHOSEN for k in ex.kinds] for s, ex in by.items()}
    assert chosen["token"] != chosen["whole_word"] != chosen["span"] != chosen["token"]
    pieces = by["token"].tokens
    for name in ("whole_word", "span"):  # a word is chosen with all of its ## pieces, or not at all
        for i, piece in enumerate(pieces):
            if piece.startswith("##"):
                assert chosen[name][i] == chosen[name][i - 1], (name, i, piece)
    # spans: fewer units than chosen tokens (several adjacent words per span)
    span = by["span"]
    assert len({u for u in span.units if u >= 0}) < span.num_chosen


def test_controls_redraw_the_example(panel):
    first = panel.example_html.value
    panel.strategy.value = "whole_word"
    assert panel.example.strategy == "whole_word" and panel.example_html.value != first
    n = panel.example.num_chosen
    panel.rate.value = 0.5
    assert panel.example.num_chosen > n
    pairs, seed = panel.pairs_html.value, panel.seed.value
    masked = panel.example.masked
    panel.new_draw.click()
    assert panel.seed.value == seed + 1
    assert panel.example.seed == seed + 1 and panel.example.masked != masked
    assert panel.pairs_html.value != pairs


def test_entity_and_phrase_masking_show_on_tagged_text_and_say_why_not_on_typed_text(panel):
    for strategy, hidden in (("entity", {"paris", "france"}), ("phrase", set())):
        panel.strategy.value = strategy
        assert panel.example.strategy == strategy and panel.messages == []
        chosen = {t for t, k in zip(panel.example.tokens, panel.example.kinds) if k != MaskKind.NOT_CHOSEN}
        assert hidden <= chosen
    panel.text.value = "My own sentence about Paris."
    assert panel.example is None and panel.example_html.value == ""
    assert any(lvl == "error" and "Tagged sentence" in msg for lvl, msg in panel.messages), panel.messages
    panel.strategy.value = "token"  # the other three still draw; the two rows say what they need
    rows = panel.strategies_html.value
    assert rows.count('class="bl-strategy"') == 5 and rows.count("needs tagged text") == 2


def test_a_tagged_sentence_comes_from_conll2003(panel):
    from bertlab.training.corpora import available_corpora

    if "conll2003" not in {name for _, name in available_corpora()}:
        pytest.skip("CoNLL-2003 is not in BERTLAB_DATA")
    panel.strategy.value = "entity"
    panel.tagged_draw.click()
    assert panel.text.value != DEFAULT_TEXT and panel.example is not None and panel.example.num_chosen > 0
    assert "CoNLL-2003" in panel.messages[-1][1]
    assert "needs tagged text" not in panel.strategies_html.value


@pytest.mark.parametrize("text, level, words", [
    ("", "error", "empty"),
    ("   ", "error", "empty"),
    ("[MASK]", "error", "nothing to mask"),
    ("[MASK] [MASK]", "error", "nothing to mask"),
    ("word " * 600, "warning", "cut"),
    ("I love pizza 🍕!", "warning", "[UNK]"),
])
def test_bad_text_gets_a_message_not_a_traceback(panel, text, level, words):
    panel.text.value = text
    assert any(lvl == level and words in msg for lvl, msg in panel.messages), panel.messages


def test_cjk_and_a_long_text(panel):
    panel.text.value = "东京是日本的首都。北京是中国的首都。"
    assert not [m for lvl, m in panel.messages if lvl == "error"]
    assert kinds_in(panel.example_html.value)
    panel.text.value = "word " * 600
    assert len(kinds_in(panel.example_html.value)) == 128  # cut to MAX_TOKENS, with a warning


# -- sentence pairs ----------------------------------------------------------------------------
def test_pairs_show_both_nsp_labels_and_sop(default_model):
    _, tok = default_model
    demo = example_pairs(FALLBACK_DOCUMENTS, tok, seed=0)
    assert sorted(p.label for p in demo.nsp) == [0, 1]
    for p in demo.nsp:  # IsNext: B from A's document; NotNext: from another one
        assert (p.doc_index == p.b_doc_index) == (p.label == 0)
    assert demo.sop and all(p.doc_index == p.b_doc_index for p in demo.sop)
    ids = demo.nsp[0].input_ids
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id


def test_panel_pairs_html(panel):
    html = panel.pairs_html.value
    assert 'data-task="nsp" data-label="0"' in html and 'data-task="nsp" data-label="1"' in html
    assert 'data-task="sop"' in html
    assert "IsNext" in html and "NotNext" in html


# -- curves and progress -----------------------------------------------------------------------
def test_curves_figure_has_three_traces_with_the_points():
    points = [{"step": 5, "mlm_loss": 9.1, "mlm_acc": 0.01, "nsp_acc": 0.5},
              {"step": 10, "mlm_loss": 8.0, "mlm_acc": 0.05, "nsp_acc": None}]
    fig = plot_pretrain_curves(points)
    assert [list(t.x) for t in fig.data] == [[5, 10], [5, 10], [5]]
    assert list(fig.data[0].y) == [9.1, 8.0]
    assert len(plot_pretrain_curves([]).data) == 3


def test_progress_text():
    assert progress_text(50, 200, 1234.0, 10.0) == "step 50 / 200 · 1,234 tokens/s · about 0:30 left"
    assert progress_text(200, 200, None, 40.0) == "step 200 / 200"


def test_documents_for_run_takes_only_what_a_short_run_needs():
    docs = [Document(["one two three four five six seven eight nine ten."] * 10, title=str(i)) for i in range(100)]
    few = documents_for_run(docs, tokens_needed=2000)
    assert 20 <= len(few) < 100
    assert len(documents_for_run(docs, tokens_needed=10**7)) == 100


# -- pre-training runs through the panel -------------------------------------------------------
def test_a_short_run_fills_the_curves_and_joins_the_picker(train_panel):
    p = train_panel
    p.start.click()
    assert p.start.disabled and not p.stop.disabled
    assert p.job.wait(120)
    assert p.result is not None and p.result.status == "completed", p.run_messages
    assert p.progress.value == p.progress.max == 8
    assert list(p.curves.data[0].x)[-1] == 8 and len(p.curves.data[0].x) == len(p.points) >= 2
    assert all(y > 0 for y in p.curves.data[0].y)  # MLM loss
    assert len(p.curves.data[2].x) == len(p.points)  # NSP accuracy
    assert [step for step, _ in p.probe_rows] == [0, 3, 6, 8]
    assert all(len(cands) == 5 for _, cands in p.probe_rows)
    assert 'data-step="8"' in p.probe_html.value
    (name, model, tok), = p.made
    assert name == "mini BERT (tiny, 8 steps)" and tok is p.tok
    assert "joined the model picker" in p.run_messages[-1][1]
    assert not p.start.disabled and p.stop.disabled
    assert model.config.num_hidden_layers == 2 and not model.training
    preds = fill_mask(model, tok, "the cat saw a [MASK] .", k=3)
    assert len(preds[0].candidates) == 3
    assert "pre-training curves" in p.figures()


def test_stop_mid_run_keeps_a_usable_model(train_panel):
    p = train_panel
    _stop_after_two_steps(p)
    assert p.job.wait(60)
    assert p.result.status == "cancelled"
    assert 2 <= p.result.step < 2000
    (name, model, tok), = p.made
    assert name == f"mini BERT (tiny, {p.result.step} steps)"
    assert "stopped" in p.run_messages[-1][1]
    assert fill_mask(model, tok, "the [MASK] saw a dog .", k=2)[0].candidates
    assert not p.start.disabled


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "missing.txt", "not an installed corpus"),
    (lambda d: _write(d / "empty.txt", "\n\n"), "holds no text"),
    (lambda d: _write(d / "one.txt", "The cat saw a dog. The dog saw a cat. A bird saw a fish."), "two documents"),
])
def test_a_corpus_error_becomes_a_message(train_panel, tmp_path, make, words):
    p = train_panel
    p.corpus_path.value = str(make(tmp_path))
    p.start.click()
    assert p.job.wait(60)
    assert p.run_messages[-1][0] == "error" and words in p.run_messages[-1][1], p.run_messages
    assert p.made == [] and not p.start.disabled and p.stop.disabled


def test_bad_settings_are_a_message(train_panel):
    train_panel.seq_len.options = [8, 32]
    train_panel.seq_len.value = 8
    train_panel.start.click()
    assert train_panel.job.state == "pending"
    assert "seq_len" in train_panel.run_messages[-1][1]


def test_set_model_uses_the_new_tokenizer(panel, small_tok):
    panel.set_model(new_model("tiny", small_tok), small_tok)
    panel.text.value = "the cat saw a dog near the river ."
    assert panel.example.tokens == ["[CLS]", "the", "cat", "saw", "a", "dog", "near", "the", "river", ".", "[SEP]"]
    assert panel.messages == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_the_progress_line_says_where_a_stopped_run_ended(train_panel, tmp_path):
    """After Stop the line said "step 80 / 3000 · about 11:06 left" (the last logged step)."""
    p = train_panel
    _stop_after_two_steps(p)
    assert p.job.wait(60) and p.result.status == "cancelled"
    assert p.progress_label.value == f"stopped at step {p.result.step} / 2000"
    assert p.progress.value == p.result.step
    p.corpus_path.value = str(tmp_path / "missing.txt")  # a run that cannot start: no "preparing the data…"
    p.start.click()
    assert p.job.wait(60) and p.run_messages[-1][0] == "error"
    assert p.progress_label.value == "stopped on an error"


def _stop_after_two_steps(p) -> None:
    """Start a 2 000-step run and press Stop once it has done two steps (or within a minute)."""
    p.steps.value = 2000
    p.start.click()
    deadline = time.monotonic() + 60
    while (p.run is None or p.run.step < 2) and p.job.running and time.monotonic() < deadline:
        time.sleep(0.02)
    p.stop.click()
