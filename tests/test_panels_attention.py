"""Attention tab without a browser: the pure computation, the figure, and
the panel driven through its widgets (set a value, assert on the FigureWidget)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlab.analysis.attention import attention_patterns
from bertlab.panels.attention import DEFAULT_TEXT, AttentionPanel
from bertlab.viz.attention import plot_attention_heatmap

PARIS = "Paris is the capital of France."
PARIS_TOKENS = ["[CLS]", "paris", "is", "the", "capital", "of", "france", ".", "[SEP]"]


@pytest.fixture
def panel(default_model) -> AttentionPanel:
    model, tok = default_model
    return AttentionPanel(model, tok)


@pytest.fixture
def runs(panel, monkeypatch) -> list[int]:
    """Counts forward passes of the panel's model from here on."""
    calls: list[int] = []
    real = panel.model.run_with_cache

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(panel.model, "run_with_cache", counting)
    return calls


def fig_z(panel) -> np.ndarray:
    return np.asarray(panel.figure.data[0].z, dtype=np.float32)


def expected(panel, text: str, layer: int, head: int, b: str | None = None) -> np.ndarray:
    return attention_patterns(panel.model, panel.tok, text, b, max_length=panel.max_length).pattern(layer, head).numpy()


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


# -- the pure computation ---------------------------------------------------------------------
def test_patterns_are_every_layer_in_order_for_the_pair(default_model):
    # the hook patterns themselves are checked against transformers in test_model.py
    model, tok = default_model
    result = attention_patterns(model, tok, PARIS, "It is big.")
    enc = tok.encode(PARIS, "It is big.")
    ids, types = torch.tensor([enc.ids]), torch.tensor([enc.type_ids])
    names = [f"bert.encoder.layer.{i}.attention.self.hook_pattern" for i in range(6)]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, token_type_ids=types, names=names)
        _, one_segment = model.run_with_cache(ids, names=names)
    assert result.patterns.shape == (6, 12, len(enc), len(enc))
    assert result.patterns.dtype == torch.float32 and result.patterns.device.type == "cpu"
    for i, name in enumerate(names):
        torch.testing.assert_close(result.patterns[i], cache[name][0])
    assert not torch.allclose(result.patterns[0], one_segment[names[0]][0])  # B was read as segment 1
    assert result.tokens == enc.tokens and result.sentence_b_start == len(PARIS_TOKENS)


def test_patterns_leave_the_model_mode_alone(default_model):
    model, tok = default_model
    model.train()
    try:
        a = attention_patterns(model, tok, PARIS).patterns
        b = attention_patterns(model, tok, PARIS).patterns
        assert model.training  # restored
    finally:
        model.eval()
    torch.testing.assert_close(a, b)  # dropout was off while reading
    torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))


def test_long_text_is_cut_with_a_warning(default_model):
    model, tok = default_model
    result = attention_patterns(model, tok, "word " * 300, max_length=64)
    assert len(result.tokens) == 64 and result.patterns.shape[-1] == 64
    assert "300" not in result.warning and "302 tokens" in result.warning and "238" in result.warning


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_text_is_refused_with_a_message(default_model, text):
    model, tok = default_model
    with pytest.raises(ValueError, match="type a sentence"):
        attention_patterns(model, tok, text)


def test_figure_has_tokens_on_both_axes(default_model):
    model, tok = default_model
    result = attention_patterns(model, tok, "the cat saw the dog", "It ran.")
    fig = plot_attention_heatmap(result, 2, 5)
    tokens = list(result.tokens)
    assert list(fig.layout.xaxis.ticktext) == tokens == list(fig.layout.yaxis.ticktext)
    assert list(fig.layout.xaxis.tickvals) == list(range(len(tokens)))  # repeated "the" kept apart
    assert fig.layout.yaxis.autorange == "reversed"  # first query on top
    np.testing.assert_allclose(fig.data[0].z, result.pattern(2, 5).numpy(), atol=1e-4)
    assert fig.data[0].customdata[1][3].tolist() == [tokens[1], tokens[3]]  # hover: query, key
    assert "Layer 2, head 5" in fig.layout.title.text
    assert len(fig.layout.shapes) == 2  # the A | B split


# -- the panel --------------------------------------------------------------------------------
def test_panel_shows_the_default_sentence(panel):
    tokens = panel.tok.encode(DEFAULT_TEXT).tokens
    assert list(panel.figure.layout.xaxis.ticktext) == tokens == list(panel.figure.layout.yaxis.ticktext)
    np.testing.assert_allclose(fig_z(panel), expected(panel, DEFAULT_TEXT, 0, 0), atol=1e-4)
    assert f"{len(tokens)} tokens" in notes(panel, "info")
    assert panel.widget.children  # something to display
    assert (panel.layer.max, panel.head.max) == (5, 11)


def test_sliders_redraw_without_running_the_model(panel, runs):
    panel.layer.value = 3
    panel.head.value = 7
    np.testing.assert_allclose(fig_z(panel), expected(panel, DEFAULT_TEXT, 3, 7), atol=1e-4)
    assert panel.figure.layout.title.text.startswith("Layer 3, head 7")
    assert len(runs) == 1  # only `expected` above ran the model


def test_new_text_recomputes_and_keeps_layer_and_head(panel, runs):
    panel.layer.value, panel.head.value = 4, 2
    panel.text_a.value = PARIS
    assert len(runs) == 1
    assert list(panel.figure.layout.xaxis.ticktext) == PARIS_TOKENS
    assert list(panel.figure.layout.yaxis.ticktext) == PARIS_TOKENS
    np.testing.assert_allclose(fig_z(panel), expected(panel, PARIS, 4, 2), atol=1e-4)
    panel.show_button.click()  # same text: nothing to recompute
    assert len(runs) == 2  # 1 + the `expected` call


def test_sentence_b_adds_a_segment(panel):
    panel.text_a.value = PARIS
    panel.text_b.value = "It is big."
    ticks = list(panel.figure.layout.xaxis.ticktext)
    assert ticks == PARIS_TOKENS + ["it", "is", "big", ".", "[SEP]"]
    assert panel.result.sentence_b_start == len(PARIS_TOKENS)
    assert len(panel.figure.layout.shapes) == 2
    assert "two sentences" in notes(panel, "info")
    panel.text_b.value = "  "  # cleared: back to one sentence
    assert list(panel.figure.layout.xaxis.ticktext) == PARIS_TOKENS and not panel.figure.layout.shapes


def test_empty_text_gives_a_message_not_a_traceback(panel):
    panel.text_a.value = "  "
    assert "type a sentence" in notes(panel, "error")
    assert panel.result is None and fig_z(panel).size == 0  # no old picture under the new error
    panel.head.value = 1  # sliders do not raise meanwhile
    assert "Something went wrong" not in notes(panel, "error")
    panel.text_a.value = PARIS
    assert not notes(panel, "error") and list(panel.figure.layout.xaxis.ticktext) == PARIS_TOKENS


def test_over_long_text_is_cut_with_a_visible_note(panel):
    panel.text_a.value = "The quick brown fox. " * 60
    assert len(panel.figure.data[0].z) == panel.max_length  # (its axis labels are thinned to fit)
    warning = notes(panel, "warning")
    assert "cut" in warning and str(panel.max_length) in warning
    assert "cut" in panel.message.value  # shown in the panel's HTML, not only kept


def test_cjk_and_emoji_are_shown_with_a_note_on_unknown_pieces(panel):
    panel.text_a.value = "我爱北京 🙂🤖 café"
    ticks = list(panel.figure.layout.xaxis.ticktext)
    assert ticks[0] == "[CLS]" and "北" in ticks and "cafe" in ticks
    assert ticks.count("[UNK]") == panel.result.num_unknown > 0
    assert "[UNK]" in notes(panel, "warning")
    assert not notes(panel, "error")


def test_messages_are_escaped_text(panel):
    panel.show_messages([("error", "<script>alert(1)</script>"), ("info", "a & b")])
    assert "<script>" not in panel.message.value and "&lt;script&gt;" in panel.message.value
    assert "a &amp; b" in panel.message.value and panel.message.value.count("bertlab-note") == 2


def test_a_bug_in_the_model_becomes_a_message(panel, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(panel.model, "run_with_cache", broken)
    panel.text_a.value = "anything new"
    assert "Something went wrong" in notes(panel, "error") and "boom" in notes(panel, "error")


def test_panel_starting_empty_shows_a_placeholder_then_draws(default_model):
    model, tok = default_model
    panel = AttentionPanel(model, tok, text="")
    assert "type a sentence" in notes(panel, "error")
    assert panel.result is None and panel.figure.layout.annotations
    panel.text_a.value = PARIS
    assert list(panel.figure.layout.xaxis.ticktext) == PARIS_TOKENS
    assert panel.figure.layout.xaxis.visible and not panel.figure.layout.annotations
    assert panel.figure.data[0].showscale


# -- the views: one on show at a time, each drawn when chosen and reused ------------------------
def shown(panel) -> list:
    return list(panel.stage.children)


def test_one_view_is_on_show_and_the_heatmap_first(panel):
    assert panel.view.options == ("Heatmap", "Head view", "Model view", "Rollout", "bertviz", "Masks")
    assert panel.view.value == "Heatmap" and shown(panel) == [panel.figure]
    assert panel.attention_view is None and panel.rollout_figure is None and not panel.bertviz_frame.value
    children = list(panel.widget.children)  # the heatmap comes before any other figure in the tab
    assert children.index(panel.stage) > children.index(panel.message)
    panel.view.value = "Head view"
    assert shown(panel) == [panel.attention_view] and panel.figure not in shown(panel)
    panel.view.value = "Rollout"
    assert shown(panel) == [panel.rollout_figure]
    assert "rollout" in panel.help.value
    panel.view.value = "Heatmap"
    assert shown(panel) == [panel.figure]


def test_head_view_is_one_widget_updated_in_place(panel, runs):
    panel.view.value = "Head view"
    view = panel.attention_view
    r = panel.result
    assert view.view == "head" and view.tokens == r.tokens and view.shape == [6, 12, len(r.tokens), len(r.tokens)]
    np.testing.assert_allclose(view.attention.numpy(), r.patterns.numpy(), atol=float(r.patterns.max()) / 500)
    panel.layer.value, panel.head.value = 2, 5
    assert (view.layer, view.heads) == (2, [5])
    panel.text_a.value = PARIS
    panel.text_b.value = "It is big."
    assert panel.attention_view is view and len(runs) == 2  # same widget, one run per text
    assert view.tokens == PARIS_TOKENS + ["it", "is", "big", ".", "[SEP]"]
    assert view.sentence_b_start == len(PARIS_TOKENS) and (view.layer, view.heads) == (2, [5])
    panel.view.value = "Model view"
    assert panel.attention_view is view and view.view == "model" and shown(panel) == [view]
    assert len(runs) == 2


def test_controls_inside_the_view_move_the_sliders(panel):
    panel.view.value = "Head view"
    view = panel.attention_view
    view.layer = 4  # as the browser sends it
    assert panel.layer.value == 4
    view.heads = [9]
    assert panel.head.value == 9
    view.heads = [1, 2]  # several heads: the slider stays
    assert panel.head.value == 9
    view.view = "model"
    assert panel.view.value == "Model view"
    panel.view.value = "Heatmap"
    assert panel.figure.layout.title.text.startswith("Layer 4, head 9")


def test_views_are_drawn_only_when_on_show(panel, runs):
    panel.view.value = "Head view"
    view = panel.attention_view
    panel.view.value = "Heatmap"
    panel.text_a.value = PARIS  # the hidden head view is not updated ...
    assert view.tokens != PARIS_TOKENS
    panel.view.value = "Head view"  # ... until it is chosen again
    assert view.tokens == PARIS_TOKENS and len(runs) == 1


def test_rollout_beside_raw_attention_follows_the_layer(panel, runs):
    from bertlab.analysis.rollout import compute_rollout

    panel.text_a.value = PARIS
    panel.view.value = "Rollout"
    expected_rollout = compute_rollout(panel.model, panel.tok, PARIS, max_length=panel.max_length)
    fig = panel.rollout_figure
    for layer in (0, 3, 5):
        panel.layer.value = layer
        np.testing.assert_allclose(fig.data[0].z, expected_rollout.raw[layer].numpy(), atol=1e-4)
        np.testing.assert_allclose(fig.data[1].z, expected_rollout.rollout[layer].numpy(), atol=1e-4)
        assert f"layer {layer}" in fig.layout.annotations[0].text
    assert "layers 0–5" in fig.layout.annotations[1].text
    assert len(runs) == 2  # the panel's PARIS run + compute_rollout above
    panel.text_a.value = "the cat sat"
    assert panel.rollout_figure is fig and list(fig.layout.xaxis.ticktext) == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert np.asarray(fig.data[0].z).shape == (5, 5)


def test_bertviz_is_built_only_when_chosen(panel, monkeypatch):
    import bertlab.viz.bertviz_offline as offline

    built: list[str] = []
    for name in ("bertviz_head_view", "bertviz_model_view"):
        real = getattr(offline, name)
        monkeypatch.setattr(offline, name, lambda *a, _real=real, _n=name, **k: built.append(_n) or _real(*a, **k))
    panel.text_a.value = PARIS
    panel.layer.value = 2
    assert built == [] and not panel.bertviz_frame.value
    panel.view.value = "bertviz"
    assert built == ["bertviz_head_view"] and shown(panel) == [panel.bertviz_box]
    page = panel.bertviz_frame.value
    assert page.startswith("<iframe") and "srcdoc=" in page and "cdnjs" not in page and "paris" in page
    panel.layer.value = 3  # bertviz has its own layer menu: no rebuild
    assert built == ["bertviz_head_view"]
    panel.bertviz_kind.value = "model view"
    assert built == ["bertviz_head_view", "bertviz_model_view"]
    panel.view.value = "Heatmap"
    panel.text_a.value = "the cat sat"
    assert len(built) == 2  # hidden: not rebuilt
    assert not notes(panel, "error")


def test_bertviz_missing_libraries_give_a_message(panel, monkeypatch):
    import bertlab.viz.bertviz_offline as offline

    def missing(*args, **kwargs):
        raise offline.OfflineLibraryError("bertviz needs JS that the 'mpld3' package ships; install it.")

    monkeypatch.setattr(offline, "bertviz_head_view", missing)
    panel.view.value = "bertviz"
    assert "mpld3" in notes(panel, "error") and "other views work" in notes(panel, "error")
    panel.view.value = "Head view"  # the rest still works
    assert shown(panel) == [panel.attention_view]


def test_128_tokens_of_every_head_stay_under_2_mb(panel):
    panel.text_a.value = "The quick brown fox jumps over the lazy dog. " * 20
    panel.view.value = "Head view"
    state = panel.attention_view.get_state()
    payload = sum(len(v) if isinstance(v, (bytes, bytearray, memoryview)) else len(str(v)) for v in state.values())
    assert panel.attention_view.shape == [6, 12, 128, 128]
    assert payload <= 2 * 1024 * 1024


# -- switching model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    from bertlab.loading import load

    return load(tiny_checkpoints["BertForPreTraining"])  # 2 layers x 4 heads


def test_set_model_follows_the_new_config_and_clamps_the_sliders(panel, tiny, default_model):
    panel.view.value = "Head view"
    panel.layer.value, panel.head.value = 4, 7
    view = panel.attention_view
    model, tok = tiny
    panel.set_model(model, tok)
    assert (panel.layer.max, panel.head.max) == (1, 3) and (panel.layer.value, panel.head.value) == (1, 3)
    assert panel.result.patterns.shape[:2] == (2, 4)
    assert panel.attention_view is view and view.shape[:2] == [2, 4] and view.layer == 1
    assert view.tokens == tok.encode(DEFAULT_TEXT).tokens
    panel.view.value = "Heatmap"
    np.testing.assert_allclose(fig_z(panel), expected(panel, DEFAULT_TEXT, 1, 3), atol=1e-4)
    assert panel.figure.layout.title.text.startswith("Layer 1, head 3")
    panel.set_model(*default_model)
    assert (panel.layer.max, panel.head.max) == (5, 11) and (panel.layer.value, panel.head.value) == (1, 3)
    np.testing.assert_allclose(fig_z(panel), expected(panel, DEFAULT_TEXT, 1, 3), atol=1e-4)


def test_figures_are_the_heatmap_and_the_rollout(panel):
    import plotly.graph_objects as go

    panel.text_a.value = PARIS
    panel.layer.value, panel.head.value = 3, 1
    figs = panel.figures()
    assert set(figs) == {"heatmap", "rollout"} and all(type(f) is go.Figure for f in figs.values())
    np.testing.assert_allclose(figs["heatmap"].data[0].z, expected(panel, PARIS, 3, 1), atol=1e-4)
    assert "layer 3" in figs["rollout"].layout.annotations[0].text
    assert panel.rollout_figure is None  # exported without building the hidden view


def test_figures_before_any_result_are_empty(default_model):
    model, tok = default_model
    assert AttentionPanel(model, tok, text="").figures() == {}


# -- Stale messages, controls that do not apply, the busy sign ---------------------------
def test_an_error_clears_the_picture_and_goes_away_when_the_text_is_back(panel):
    panel.text_a.value = ""
    assert "The text is empty" in notes(panel, "error")
    assert panel.result is None and panel.figures() == {} and fig_z(panel).size == 0
    assert "Type a sentence" in panel.figure.layout.annotations[0].text
    panel.text_a.value = DEFAULT_TEXT  # the text the panel opened with: shown again, message gone
    assert not notes(panel, "error") and panel.result is not None
    want = attention_patterns(panel.model, panel.tok, DEFAULT_TEXT)
    np.testing.assert_allclose(fig_z(panel), want.patterns[0, 0].numpy(), atol=1e-3)


def test_each_view_shows_only_the_sliders_it_uses(panel):
    shown = {}
    for view in ("Heatmap", "Head view", "Model view", "Rollout", "bertviz"):
        panel.view.value = view
        shown[view] = [s.description for s in (panel.layer, panel.head) if s.layout.display != "none"]
    assert shown == {"Heatmap": ["Layer", "Head"], "Head view": ["Layer"], "Model view": [], "Rollout": ["Layer"],
                     "bertviz": []}  # bertviz has its own controls inside its page; the head view's chips pick heads
    assert panel.attention_view.controls is False  # one set of controls: no second view toggle nor layer drop-down


def test_a_new_text_and_a_new_view_show_a_busy_sign(panel, monkeypatch):
    from bertlab.panels import attention as panel_module

    seen = []
    real = panel_module.attention_patterns

    def watching(*args, **kwargs):
        seen.append((panel.show_button.disabled, "bertlab-busy" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(panel_module, "attention_patterns", watching)
    panel.text_a.value = "The cat sat on the mat."
    assert seen == [(True, True)] and not panel.show_button.disabled
    drawn = []
    real_draw = panel._draw_rollout
    monkeypatch.setattr(panel, "_draw_rollout", lambda old: drawn.append(
        (panel.view.disabled, "bertlab-busy" in panel.message.value)) or real_draw(old))
    panel.view.value = "Rollout"
    assert drawn == [(True, True)] and not panel.view.disabled and "bertlab-busy" not in panel.message.value
