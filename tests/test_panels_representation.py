"""Input tab without a browser: build the panel, set widget values, assert on the figures
(against input_representation computed independently) and on the messages."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from bertlab.analysis.representation import first_tokens, input_representation
from bertlab.loading import load
from bertlab.panels.representation import DEFAULT_TEXT, DEFAULT_TEXT_B, RepresentationPanel
from bertlab.viz.representation import PART_LABELS

DEFAULT_TOKENS = ["[CLS]", "the", "un", "##bel", "##ie", "##va", "##bly", "clue", "##less", "gamer", "played",
                  "it", ".", "[SEP]", "it", "was", "fine", ".", "[SEP]"]


@pytest.fixture
def panel(default_model) -> RepresentationPanel:
    model, tok = default_model
    return RepresentationPanel(model, tok)


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


def table_column(panel, i: int) -> list[str]:
    """Column i of the input table (0 = row names): piece, segment, position, word, id, as the student
    reads them (the figure holds them escaped: plotly decodes the entities)."""
    return [html.unescape(v) if isinstance(v, str) else v for v in panel.table.data[0].cells.values[i]]


def bars(panel, part: str) -> np.ndarray:
    (trace,) = [t for t in panel.norms.data if t.name == PART_LABELS[part]]
    return np.asarray(trace.y, dtype=np.float32)


def test_opens_on_the_default_pair_with_word_pieces(panel):
    assert (panel.text_a.value, panel.text_b.value) == (DEFAULT_TEXT, DEFAULT_TEXT_B)
    pieces = [table_column(panel, i + 1)[0] for i in range(len(DEFAULT_TOKENS))]
    assert pieces == DEFAULT_TOKENS
    assert [table_column(panel, i + 1)[1] for i in (0, 13, 14, 18)] == ["A", "A", "B", "B"]
    assert [table_column(panel, i + 1)[2] for i in (0, 5, 18)] == ["0", "5", "18"]
    info = notes(panel, "info")
    assert "19 tokens, two sentences" in info
    assert "clueless → clue ##less" in info and "unbelievably → un ##bel ##ie ##va ##bly" in info
    assert notes(panel, "warning") == notes(panel, "error") == ""


def test_bars_and_map_are_the_parts_of_the_model(panel):
    want = input_representation(panel.model, panel.tok, DEFAULT_TEXT, DEFAULT_TEXT_B)
    for part in ("token", "segment", "position", "sum", "normalised"):
        np.testing.assert_allclose(bars(panel, part), want.norms[part].numpy(), atol=1e-4)
    visible = {t.name: t.visible for t in panel.norms.data}
    assert visible[PART_LABELS["normalised"]] == "legendonly" and visible[PART_LABELS["token"]] is not False
    # the map: one trace per additive part; the sum point is the sum of the three part points
    assert [t.name for t in panel.projection.data] == [PART_LABELS[p] for p in ("token", "segment", "position", "sum")]
    xy = [np.stack([np.asarray(t.x), np.asarray(t.y)], axis=1) for t in panel.projection.data]
    np.testing.assert_allclose(xy[0] + xy[1] + xy[2], xy[3], atol=1e-3)


def test_new_text_redraws_everything_in_place(panel):
    shown = panel._widgets()
    panel.text_b.value = ""
    panel.text_a.value = "Paris is big."
    assert [table_column(panel, i + 1)[0] for i in range(6)] == ["[CLS]", "paris", "is", "big", ".", "[SEP]"]
    assert len(table_column(panel, 0)) == 5 and len(panel.table.data[0].cells.values) == 7
    assert {table_column(panel, i + 1)[1] for i in range(6)} == {"A"}
    assert len(bars(panel, "token")) == 6 and len(panel.projection.data[0].x) == 6
    assert "6 tokens, one sentence" in notes(panel, "info")
    assert set(panel.figures()) == {"input table", "part norms", "parts in 2-D"}
    assert all(type(f) is go.Figure for f in panel.figures().values())
    assert all(a is b for a, b in zip(panel._widgets(), shown))  # same traces: updated, not replaced
    assert [box.children[0] for box in panel.boxes] == list(shown)


def test_same_text_again_does_not_rerun(panel, monkeypatch):
    calls = []
    embeddings = panel.model.bert.embeddings  # the only part of the model this tab runs
    real = embeddings.forward
    monkeypatch.setattr(embeddings, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    panel.show_button.click()
    assert calls == []
    panel.text_b.value = "Something else."
    assert calls == [1]


@pytest.mark.parametrize(
    ("a", "b", "level", "expected"),
    [
        ("", "", "error", "The text is empty"),
        ("   ", "It was fine.", "error", "The text is empty"),
        ("I love pizza 🍕", "", "warning", "[UNK]"),
        ("[MASK]", "", "info", "[MASK] is an ordinary vocabulary piece"),
        ("Hello there.", "   ", "info", "Sentence B is blank"),
    ],
)
def test_awkward_input_gives_a_message(panel, a, b, level, expected):
    panel.text_b.value = b
    panel.text_a.value = a
    assert expected in notes(panel, level)


def test_cjk_is_read_piece_by_piece(panel):
    panel.text_b.value = ""
    panel.text_a.value = "東京は大きい"
    pieces = [table_column(panel, i + 1)[0] for i in range(len(panel.table.data[0].cells.values) - 1)]
    assert pieces == ["[CLS]", "東", "京", "は", "大", "き", "##い", "[SEP]"]
    assert notes(panel, "error") == ""


def test_long_text_is_cut_with_notes_and_exact_parts(panel):
    panel.text_b.value = ""
    panel.text_a.value = " ".join(["word"] * 600)
    warn = notes(panel, "warning")
    assert "602 tokens long" in warn and "first 64 of the 512 tokens" in warn
    assert len(panel.table.data[0].cells.values) == 65 and len(bars(panel, "position")) == 64
    full = input_representation(panel.model, panel.tok, panel.text_a.value)
    np.testing.assert_allclose(bars(panel, "position"), full.norms["position"][:64].numpy(), atol=1e-4)


def test_first_tokens_refits_the_map_to_what_is_shown(default_model):
    model, tok = default_model
    full = input_representation(model, tok, "One two three four five six seven eight nine ten.")
    cut = first_tokens(full, 5)
    assert cut.tokens == full.tokens[:5] and cut.projection.shape == (4, 5, 2)
    torch.testing.assert_close(cut.parts["sum"], full.parts["sum"][:5])
    # the same first 5 tokens in a shorter text: the same map, so it is fitted to the shown tokens only
    other = first_tokens(input_representation(model, tok, "One two three four"), 5)
    assert other.tokens == cut.tokens
    torch.testing.assert_close(cut.projection, other.projection, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(full.projection[:, :5], cut.projection, atol=1e-3)
    assert first_tokens(full, 100) is full


def test_set_model_redraws_with_the_other_model(panel, tiny_checkpoints):
    tiny, tiny_tok = load(tiny_checkpoints["BertModel"])
    panel.set_model(tiny, tiny_tok)
    want = input_representation(tiny, tiny_tok, DEFAULT_TEXT, DEFAULT_TEXT_B)
    pieces = [table_column(panel, i + 1)[0] for i in range(len(want.tokens))]
    assert pieces == want.tokens and pieces != DEFAULT_TOKENS  # the tiny vocabulary splits differently
    np.testing.assert_allclose(bars(panel, "token"), want.norms["token"].numpy(), atol=1e-4)
    assert notes(panel, "error") == ""


# -- An error clears the pictures; its message goes when the text is back ---------------
def test_the_empty_text_message_goes_away_when_the_text_is_back(panel):
    text = panel.text_a.value
    panel.text_a.value = ""
    assert "The text is empty" in notes(panel, "error")
    assert panel.rep is None and panel.figures() == {} and len(panel.table.data) == 0
    panel.text_a.value = text  # the text shown before the error
    assert not notes(panel, "error") and panel.rep is not None and set(panel.figures())
    panel.text_a.value = "A \ud800 here."
    assert "broken character" in notes(panel, "error") and "Something went wrong" not in notes(panel, "error")
    assert panel.rep is None


def test_show_puts_up_a_busy_sign_and_disables_the_button(panel, monkeypatch):
    from bertlab.panels import representation as panel_module

    seen = []
    real = panel_module.input_representation

    def watching(*args, **kwargs):
        seen.append((panel.show_button.disabled, "bertlab-busy" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(panel_module, "input_representation", watching)
    panel.text_a.value = "The cat sat."
    assert seen == [(True, True)] and not panel.show_button.disabled and "bertlab-busy" not in panel.message.value


# -- Other families' tokenizers, named and drawn readably --------------------------------
@pytest.fixture(scope="module")
def roberta_panel(tmp_path_factory):
    """The tab on a tiny RoBERTa-like model whose byte-level BPE tokenizer is trained here."""
    from tiny_models import family_folder

    model, tok = load(family_folder(tmp_path_factory.mktemp("roberta-input"), "roberta"))
    return RepresentationPanel(model, tok)


def test_byte_level_bpe_pieces_are_named_and_readable(roberta_panel):
    from bertlab.tokenizer import WORD_START_MARK

    panel = roberta_panel
    panel.text_b.value = ""
    panel.text_a.value = "Café résumés: the quickest brown foxes jumped."
    raw = panel.tok.encode(panel.text_a.value).tokens
    n = len(raw)
    pieces = [table_column(panel, i + 1)[0] for i in range(n)]
    assert any("Ġ" in t for t in raw) and any("Ã" in t for t in raw)  # what the file stores
    assert not any("Ġ" in p or "Ã" in p for p in pieces)  # what the student sees
    assert pieces[0] == "<s>" and pieces[-1] == "</s>"  # special tokens as they are
    # the shown pieces spell the text back, the mark standing for the space before a word
    assert "".join(pieces[1:-1]).replace(WORD_START_MARK, " ") == panel.text_a.value
    starts = [p.startswith(WORD_START_MARK) for p in pieces[1:-1]]
    assert starts == [t.startswith("Ġ") for t in raw[1:-1]] and sum(starts) == 6  # every word but the first
    assert "é" in "".join(pieces)
    # the tokenizer is named from the family, never as WordPiece
    help_html = panel.help.value
    assert "byte-level BPE" in help_html and WORD_START_MARK in help_html and "WordPiece" not in help_html
    info = notes(panel, "info")
    assert "byte-level BPE pieces" in info and "WordPiece" not in info
    assert "byte-level BPE" in panel.table.layout.title.text
    assert [html.unescape(x) for x in panel.norms.data[0].x] == [f"{i} {p}" for i, p in enumerate(pieces)]  # same
    split = [s for s in info.split(": ", 1)[1].split("; ")] if "several" in info else []
    assert split and all("Ġ" not in s for s in split)


def test_sentencepiece_pieces_show_the_same_word_start_mark(tmp_path):
    from tiny_models import family_folder

    from bertlab.tokenizer import WORD_START_MARK

    model, tok = load(family_folder(tmp_path, "albert"))
    panel = RepresentationPanel(model, tok, text="The quick brown fox jumps.", text_b="")
    raw = tok.encode(panel.text_a.value).tokens
    pieces = [table_column(panel, i + 1)[0] for i in range(len(raw))]
    assert any(t.startswith("▁") for t in raw) and not any("▁" in p for p in pieces)
    assert [p.startswith(WORD_START_MARK) for p in pieces] == [t.startswith("▁") for t in raw]
    assert "SentencePiece Unigram" in panel.help.value and "WordPiece" not in panel.help.value
