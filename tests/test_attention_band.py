"""The Attention tab on a byte-level BPE model with local layers (a tiny random ModernBERT written by
transformers): its tick labels read as the Input tab's ("␣" for the word-start "Ġ"), and a local layer's
band is outlined on the heatmap with a note of how far each token sees, read from the model's own layers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_family_modernbert import modernbert_tokenizer, write_checkpoint

from bertlab.analysis.attention import attention_patterns, attention_windows
from bertlab.loading import load
from bertlab.panels.attention import AttentionPanel
from bertlab.tokenizer import WORD_START_MARK
from bertlab.viz.attention import plot_attention_heatmap

TEXT = "The quick brown fox jumps over the lazy dog near the river bank today."


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("mb-band") / "mb", "ModernBertForMaskedLM",
                              modernbert_tokenizer())
    return load(str(folder)), json.loads((folder / "config.json").read_text())


def _inside(path: str, x: float, y: float) -> bool:
    """Whether (x, y) lies inside the closed SVG path "M x,y L x,y ... Z" (even-odd ray casting)."""
    pts = [tuple(map(float, p.split(","))) for p in path.strip("MZ ").split(" L ")]
    inside = False
    for (x1, y1), (x2, y2) in zip(pts, pts[1:] + pts[:1]):
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            inside = not inside
    return inside


def test_windows_are_the_models_own_layers(modernbert, default_model):
    (model, _), cfg = modernbert
    every, half = cfg["global_attn_every_n_layers"], cfg["local_attention"] // 2
    assert attention_windows(model) == [None if i % every == 0 else half for i in range(cfg["num_hidden_layers"])]
    assert attention_windows(default_model[0]) == [None] * default_model[0].config.num_hidden_layers


def test_tick_labels_read_as_the_input_tab(modernbert):
    (model, tok), _ = modernbert
    result = attention_patterns(model, tok, TEXT)
    assert any(t.startswith("Ġ") for t in result.tokens)  # the vocabulary's spelling
    assert result.labels == tok.readable_pieces(result.tokens)
    ticks = list(plot_attention_heatmap(result, 0, 0).layout.xaxis.ticktext)
    assert ticks and not any("Ġ" in t for t in ticks) and sum(t.startswith(WORD_START_MARK) for t in ticks) > 5


def test_a_local_layer_outlines_its_band_and_a_global_layer_says_it_sees_all(modernbert):
    (model, tok), cfg = modernbert
    result = attention_patterns(model, tok, TEXT)
    n, half = len(result.tokens), cfg["local_attention"] // 2
    assert n > 2 * half + 1  # the band is narrower than the input
    for layer, window in enumerate(result.windows):
        fig = plot_attention_heatmap(result, layer, 0)
        paths = [s.path for s in fig.layout.shapes if s.type == "path"]
        notes = " ".join(a.text for a in fig.layout.annotations)
        if window is None:
            assert not paths and "global layer: every token sees every token" in notes
            continue
        assert window == half and f"each token sees ±{half} tokens" in notes
        (path,) = paths
        weights = result.patterns[layer].amax(dim=0).numpy()  # [query, key]: the most any head puts there
        for q in range(n):
            for k in range(n):
                assert _inside(path, k, q) == (abs(q - k) <= half), (q, k)
                if abs(q - k) > half:
                    assert weights[q, k] == 0.0  # the outline holds every weight the layer has


def test_bert_draws_no_band_and_no_note(default_model):
    result = attention_patterns(*default_model, "The cat sat on the mat.")
    fig = plot_attention_heatmap(result, 1, 0)
    assert not [s for s in fig.layout.shapes if s.type == "path"] and not fig.layout.annotations


def test_the_panels_band_follows_the_layer_slider(modernbert):
    (model, tok), _ = modernbert
    panel = AttentionPanel(model, tok, text=TEXT)
    windows = panel.result.windows
    local = next(i for i, w in enumerate(windows) if w is not None)
    glob = next(i for i, w in enumerate(windows) if w is None)
    for layer in (local, glob, local):
        panel.layer.value = layer
        paths = [s for s in panel.figure.layout.shapes if s.type == "path"]
        note = " ".join(a.text for a in panel.figure.layout.annotations)
        assert bool(paths) == (layer == local), layer
        assert ("local layer" in note) == (layer == local) and ("global layer" in note) == (layer == glob)
        z = np.asarray(panel.figure.data[0].z, dtype=np.float32)
        assert np.allclose(z, panel.result.pattern(layer, panel.head.value).numpy(), atol=1e-4)
    assert WORD_START_MARK in "".join(panel.figure.layout.xaxis.ticktext)
