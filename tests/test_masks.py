"""Attention masks: the grids of bertlab.masks, the six on a sentence (analysis), the figure, and the
Attention tab's Masks view driven through its widgets on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import tiny_bert

from bertlab import masks
from bertlab.analysis.attention import attention_patterns
from bertlab.analysis.attention_masks import MASK_NAMES, build_masks, masked_patterns, query_vectors
from bertlab.families.modernbert import attention_masks as modernbert_masks
from bertlab.panels.attention import AttentionPanel
from bertlab.panels.masks import MasksPanel
from bertlab.viz.masks import plot_masked_head, plot_masks

TEXT = "The animal did not cross the street because it was tired."


@pytest.fixture(scope="module")
def tiny(tok):
    return tiny_bert(tok, layers=2), tok


# -- the grids ----------------------------------------------------------------------------------
def test_bidirectional_causal_prefix_known_cells():
    assert masks.bidirectional(5).all() and masks.bidirectional(5).shape == (5, 5)
    c = masks.causal(5)
    assert c.shape == (5, 5) and c[3, 3] and c[3, 0] and not c[3, 4] and int(c.sum()) == 15
    p = masks.prefix(6, 3)
    assert p[0, 2] and p[2, 0]  # the source reads itself both ways
    assert not p[0, 3] and not p[2, 5]  # ... never the target
    assert p[4, 0] and p[4, 4] and not p[4, 5]  # the target reads the source and its left
    with pytest.raises(ValueError, match="must fit"):
        masks.prefix(4, 5)


def test_additive_is_zero_where_read_and_very_negative_elsewhere():
    add = masks.additive(masks.causal(3))
    assert add.shape == (1, 1, 3, 3)
    assert add[0, 0, 1, 0] == 0 and add[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_sliding_window_band_symmetry_and_global_rows():
    n, w = 10, 2
    s = masks.sliding_window(n, w)
    assert s.shape == (n, n) and torch.equal(s, s.T)
    assert s[0].all() and s[:, 0].all()  # [CLS] (position 0) reads and is read by all
    assert s[5, 3] and s[5, 7] and not s[5, 2] and not s[5, 8]
    assert int(s[5].sum()) == 2 * w + 1 + 1  # the band and the global token
    g = masks.sliding_window(n, 1, (0, 9))
    assert g[9].all() and g[:, 9].all() and not g[4, 6]
    with pytest.raises(ValueError, match="outside"):
        masks.sliding_window(4, 1, (4,))


def test_sliding_window_without_globals_is_modernberts_local_band():
    n, w = 12, 3
    band = modernbert_masks(None, n, w, torch.device("cpu"))["local"][0, 0]  # what a local layer applies
    assert torch.equal(masks.sliding_window(n, w, ()), band)


def test_lsh_is_deterministic_with_a_seed_and_its_mask_is_same_bucket():
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(1))
    b = masks.lsh_buckets(x, 4, seed=7)
    assert b.shape == (20,) and b.dtype == torch.long and 0 <= int(b.min()) and int(b.max()) < 4
    assert torch.equal(b, masks.lsh_buckets(x, 4, seed=7))
    assert not all(torch.equal(b, masks.lsh_buckets(x, 4, seed=s)) for s in range(8, 12))
    assert torch.equal(masks.lsh_buckets(3.0 * x, 4, seed=7), b)  # angular: the length does not matter
    m = masks.lsh_hash(b)
    assert m.diagonal().all() and torch.equal(m, m.T)
    for i in range(20):
        for j in range(20):
            assert bool(m[i, j]) == bool(b[i] == b[j])
    with pytest.raises(ValueError, match="even"):
        masks.lsh_buckets(x, 3)


def test_segment_recurrence_reads_own_segment_left_and_whole_previous_segment():
    s = masks.segment_recurrence(10, 3)  # segments 0-2, 3-5, 6-8, 9
    assert s.shape == (10, 10)
    assert s[4, 3] and s[4, 4] and not s[4, 5]  # own segment, left to right
    assert s[4, 0] and s[4, 1] and s[4, 2]  # the previous segment, all of it (cached states)
    assert s[7, 3] and s[7, 5] and not s[7, 2]  # two segments back: not a key
    assert s[9, 6] and s[9, 8] and not s[9, 5]
    assert s[:3, :3].equal(masks.causal(3))  # the first segment has no memory


# -- six masks on a sentence ------------------------------------------------------------------
def test_build_masks_six_in_order_with_counts(tiny):
    model, tok = tiny
    r = build_masks(model, tok, TEXT, window=1, segment=4)
    n = r.n
    assert [m.name for m in r.masks] == list(MASK_NAMES)
    assert all(m.allowed.shape == (n, n) and m.allowed.dtype == torch.bool and m.description for m in r.masks)
    assert r.mask("bidirectional").allowed_pairs == n * n
    assert r.mask("left-to-right").allowed_pairs == n * (n + 1) // 2
    assert torch.equal(r.mask("sliding window").allowed, masks.sliding_window(n, 1, (0,)))
    assert torch.equal(r.mask("segment recurrence").allowed, masks.segment_recurrence(n, 4))
    assert r.settings["source"] == n // 2 and torch.equal(r.mask("prefix").allowed, masks.prefix(n, n // 2))
    with pytest.raises(ValueError, match="no mask named"):
        r.mask("dilated")


def test_prefix_source_is_sentence_a_of_a_pair(tiny):
    model, tok = tiny
    r = build_masks(model, tok, "Paris is big.", "It is old.")
    assert r.settings["source"] == r.sentence_b_start == tok.encode("Paris is big.", "It is old.").sequence_ids.index(1)


def test_lsh_buckets_hash_the_models_layer0_queries(tiny):
    model, tok = tiny
    r = build_masks(model, tok, TEXT, n_buckets=4, seed=3)
    name = model.family.hook_name(0, "hook_q")
    with torch.no_grad():
        _, cache = model.run_with_cache(r.input_ids, token_type_ids=r.token_type_ids, names=[name])
    q = cache[name][0].reshape(r.n, -1)
    assert torch.allclose(query_vectors(model, r.input_ids, r.token_type_ids), q)
    assert torch.equal(r.buckets, masks.lsh_buckets(q, 4, seed=3))
    assert torch.equal(r.mask("LSH buckets").allowed, masks.lsh_hash(r.buckets))
    assert torch.equal(build_masks(model, tok, TEXT, n_buckets=4, seed=3).buckets, r.buckets)


def test_masked_patterns_read_only_inside_the_mask(tiny):
    model, tok = tiny
    r = build_masks(model, tok, TEXT, window=1)
    for name in ("left-to-right", "sliding window", "LSH buckets", "segment recurrence"):
        p = masked_patterns(model, r, name)  # [layers, heads, q, k]
        allowed = r.mask(name).allowed
        assert p.shape == (2, 4, r.n, r.n)
        assert float(p[..., ~allowed].abs().max()) == 0.0
        assert torch.allclose(p.sum(-1), torch.ones(2, 4, r.n), atol=1e-5)
    full = attention_patterns(model, tok, TEXT).patterns
    assert torch.allclose(masked_patterns(model, r, "bidirectional"), full, atol=1e-6)


def test_bad_input_messages(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="empty"):
        build_masks(model, tok, "  ")
    with pytest.raises(ValueError, match="window"):
        build_masks(model, tok, TEXT, window=-1)
    long = build_masks(model, tok, "word " * 200, max_length=40)
    assert long.n == 40 and "cut" in long.warning


# -- figures and the panel --------------------------------------------------------------------
def test_plot_masks_draws_each_grid_with_token_labels(tiny):
    model, tok = tiny
    r = build_masks(model, tok, "Tom & <b>Ann</b> met.")
    fig = plot_masks(r)
    assert len(fig.data) == 6
    for trace, m in zip(fig.data, r.masks):
        assert np.array_equal(np.asarray(trace.z, dtype=bool), m.allowed.numpy())
    assert "&amp;" in fig.layout.xaxis.ticktext  # student text drawn as typed, not as markup
    assert fig.layout.annotations[1].text.startswith("Causal (GPT)")
    head = plot_masked_head(r, "left-to-right", masked_patterns(model, r, "left-to-right")[1, 2].numpy(), 1, 2)
    assert len(head.data) == 2 and "Layer 1, head 2" in head.layout.annotations[1].text
    assert not fig.layout.shapes  # one sentence: no line between A and B
    pair = build_masks(model, tok, "Paris is big.", "It is old.")
    lines = plot_masks(pair).layout.shapes
    assert len(lines) == 12 and {ln.x0 for ln in lines if ln.y0 == -0.5} == {pair.sentence_b_start - 0.5}


def test_panel_builds_redraws_and_reports(tiny):
    model, tok = tiny
    panel = MasksPanel(model, tok)
    panel.show(TEXT)
    assert panel.result is not None and len(panel.grid_figure.data) == 6
    band = lambda: np.asarray(panel.grid_figure.data[3].z, dtype=bool)  # noqa: E731
    before = band().sum()
    panel.window.value = 3
    assert band().sum() > before and "±3" in panel.descriptions.value
    panel.chosen.value = "sliding window"
    panel.layer.value, panel.head.value = 1, 3
    z = np.asarray(panel.head_figure.data[1].z, dtype=np.float32)
    assert np.allclose(z, masked_patterns(model, panel.result, "sliding window")[1, 3].numpy(), atol=1e-4)
    assert set(panel.figures()) == {"masks", "masked head"}
    panel.show("")
    assert panel.result is None and panel.stage.children == () and "empty" in panel.messages[0][1]
    panel.show("日本語のテキストも大丈夫です。")  # other scripts are fine
    assert panel.result is not None and panel.messages[0][0] == "info"
    panel.show("word " * 300)
    assert panel.result.n == 64 and any(level == "warning" and "cut" in text for level, text in panel.messages)


def test_attention_tab_has_the_masks_view(tiny):
    model, tok = tiny
    panel = AttentionPanel(model, tok, text=TEXT)
    panel.view.value = "Masks"
    assert panel.masks is not None and panel.stage.children == (panel.masks.widget,)
    assert panel.masks.result.tokens == panel.result.tokens
    panel.text_a.value = "Paris is big."
    panel.show_button.click()
    assert panel.masks.result.text_a == "Paris is big."
    assert {"masks", "masked head"} <= set(panel.figures())


def test_attention_tab_masks_follow_a_new_model(tiny, tok):
    model, _ = tiny
    panel = AttentionPanel(model, tok, text=TEXT)
    panel.view.value = "Masks"
    other = tiny_bert(tok, seed=1, layers=3)
    panel.set_model(other, tok)
    assert panel.masks.model is other and panel.masks.layer.max == 2
    name = other.family.hook_name(0, "hook_q")
    with torch.no_grad():
        _, cache = other.run_with_cache(panel.masks.result.input_ids, names=[name])
    q = cache[name][0].reshape(panel.masks.result.n, -1)
    assert torch.equal(panel.masks.result.buckets, masks.lsh_buckets(q, 4, seed=0))


def test_panel_times_the_window_here(tiny):
    model, tok = tiny
    panel = MasksPanel(model, tok)
    assert panel.timing_box.children == () and "window timing" not in panel.figures()
    panel.timing_lengths = (16, 32)
    panel.time_button.click()
    fig = panel.timing_box.children[0]
    assert [list(trace.x) for trace in fig.data] == [[16, 32], [16, 32]]
    assert "At 32 tokens" in panel.timing_message.value and not panel.time_button.disabled
    assert "window timing" in panel.figures()
