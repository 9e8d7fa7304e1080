"""bertlab's own attention view without a browser: compact payload, widget state, HTML export."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import traitlets

import bertlab.viz
from bertlab.viz.attention_view import (
    PAYLOAD_BUDGET,
    AttentionView,
    as_attention,
    compact_attention,
    expand_attention,
    to_standalone_html,
)

TOKENS = "[CLS] the cat sat on the mat . [SEP] it was happy [SEP]".split()
B_START = 9


def softmax_attention(layers: int, heads: int, seq: int, seed: int = 0, sharpness: float = 2.0) -> torch.Tensor:
    """Random attention `[layer, head, seq, seq]` whose rows are softmax distributions."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(layers, heads, seq, seq, generator=g) * sharpness).softmax(-1)


def widget_payload_bytes(widget: AttentionView) -> int:
    """Bytes the widget's state takes on the wire: binary buffers plus the JSON of the rest."""
    state = widget.get_state()
    binary = sum(len(v) for v in state.values() if isinstance(v, (bytes, bytearray, memoryview)))
    rest = {k: v for k, v in state.items() if not isinstance(v, (bytes, bytearray, memoryview))}
    return binary + len(json.dumps(rest))


# -- compact_attention / expand_attention ----------------------------------------------------------

@pytest.mark.parametrize("compress", [True, False])
def test_quantisation_round_trip_error_is_under_one_step(compress):
    attn = softmax_attention(2, 4, 20)
    data, shape, scale = compact_attention(attn, compress=compress)
    back = expand_attention(data, shape, scale)
    assert shape == (2, 4, 20, 20)
    assert scale == pytest.approx(float(attn.max()))
    error = float((back - attn).abs().max())
    assert error <= scale / 510 + 1e-6
    assert error <= 1 / 255


def test_uncompressed_is_one_byte_per_weight_and_compressed_is_shorter():
    attn = softmax_attention(2, 4, 32)
    raw, shape, _ = compact_attention(attn, compress=False)
    deflated, _, _ = compact_attention(attn, compress=True)
    assert len(raw) == math.prod(shape)
    assert len(deflated) < len(raw)
    assert torch.equal(expand_attention(raw, shape, 0.5), expand_attention(deflated, shape, 0.5))


def test_exact_weights_survive_and_zero_attention_has_a_usable_scale():
    attn = torch.zeros(1, 2, 3, 3)
    attn[0, 0, :, 0] = 1.0
    data, shape, scale = compact_attention(attn)
    assert scale == 1.0
    assert torch.equal(expand_attention(data, shape, scale), attn)
    data, shape, scale = compact_attention(torch.zeros(1, 1, 2, 2))
    assert scale == 1.0 and torch.equal(expand_attention(data, shape, scale), torch.zeros(1, 1, 2, 2))


def test_expand_rejects_data_of_the_wrong_length():
    data, shape, scale = compact_attention(softmax_attention(1, 2, 4), compress=False)
    with pytest.raises(ValueError, match="neither 40 weights"):
        expand_attention(data, (1, 2, 4, 5), scale)
    with pytest.raises(ValueError, match="needs 24"):
        expand_attention(data, (1, 2, 3, 4), scale)


@pytest.mark.parametrize(("layers", "name"), [(6, "MiniLM 6x12"), (12, "bert-base 12x12")])
def test_payload_for_128_tokens_fits_two_megabytes(layers, name):
    attn = softmax_attention(layers, 12, 128, seed=layers)
    data, shape, scale = compact_attention(attn)
    assert shape == (layers, 12, 128, 128)
    assert len(data) <= PAYLOAD_BUDGET, name
    widget = AttentionView(attn, [f"tok{i}" for i in range(128)])
    try:
        assert widget_payload_bytes(widget) <= PAYLOAD_BUDGET, name
        assert float((widget.attention - attn).abs().max()) <= 1 / 255
    finally:
        widget.close()


# -- as_attention ----------------------------------------------------------------------------------

def test_accepts_a_tensor_a_list_per_layer_a_batch_of_one_and_numpy():
    attn = softmax_attention(3, 2, 5)
    per_layer_batched = [layer.unsqueeze(0) for layer in attn]  # what output_attentions gives
    assert torch.equal(as_attention(attn), attn)
    assert torch.equal(as_attention(list(attn)), attn)
    assert torch.equal(as_attention(per_layer_batched), attn)
    assert torch.equal(as_attention(attn.unsqueeze(1)), attn)  # cache.stack("hook_pattern"), batch 1
    assert torch.equal(as_attention(attn.double().numpy()), attn)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.rand(2, 3, 4, 4, 4), "batch of 3"),
        (torch.rand(4, 4), "expected \\[layer, head, query, key\\]"),
        (torch.full((1, 1, 2, 2), float("nan")), "NaN"),
        (-torch.rand(1, 1, 2, 2), ">= 0"),
        ([], "empty list"),
    ],
)
def test_rejects_what_is_not_one_example_of_attention(bad, message):
    with pytest.raises(ValueError, match=message):
        as_attention(bad)


def test_token_count_must_match():
    with pytest.raises(ValueError, match="4 tokens"):
        as_attention(torch.rand(1, 1, 5, 5), ["a", "b", "c", "d"])


# -- the widget ------------------------------------------------------------------------------------

@pytest.fixture
def view():
    attn = softmax_attention(3, 4, len(TOKENS))
    widget = AttentionView(attn, TOKENS, sentence_b_start=B_START)
    yield widget
    widget.close()


def test_widget_holds_shape_tokens_and_every_head(view):
    assert view.shape == [3, 4, len(TOKENS), len(TOKENS)]
    assert view.tokens == TOKENS
    assert view.sentence_b_start == B_START
    assert view.heads == [0, 1, 2, 3]
    assert (view.layer, view.view, view.pair_filter) == (0, "head", "all")
    assert isinstance(view.data, bytes) and len(view.data) < math.prod(view.shape)


def test_widget_weights_are_what_was_given(view):
    attn = softmax_attention(3, 4, len(TOKENS))
    assert view.attention.shape == attn.shape
    assert float((view.attention - attn).abs().max()) <= 1 / 255


def test_initial_layer_heads_and_view():
    attn = softmax_attention(3, 4, len(TOKENS))
    widget = AttentionView(attn, TOKENS, layer=2, heads=[3, 1], view="model")
    try:
        assert (widget.layer, widget.heads, widget.view) == (2, [1, 3], "model")
    finally:
        widget.close()


def test_choices_outside_the_model_fail_at_construction_and_export():
    attn = softmax_attention(3, 4, len(TOKENS))
    with pytest.raises(traitlets.TraitError, match="pick 0..2"):
        AttentionView(attn, TOKENS, layer=3)
    with pytest.raises(traitlets.TraitError, match=r"heads \[7\]"):
        AttentionView(attn, TOKENS, heads=[0, 7])
    with pytest.raises(ValueError, match="pick 0..2"):
        to_standalone_html(attn, TOKENS, layer=-1)
    with pytest.raises(ValueError, match="view must be"):
        to_standalone_html(attn, TOKENS, view="grid")


def test_layer_and_heads_are_checked(view):
    view.layer = 2
    view.heads = [2, 0, 2]
    assert view.heads == [0, 2]
    with pytest.raises(traitlets.TraitError, match="pick 0..2"):
        view.layer = 3
    with pytest.raises(traitlets.TraitError, match=r"heads \[4\]"):
        view.heads = [4]
    with pytest.raises(traitlets.TraitError):
        view.view = "grid"
    assert (view.layer, view.heads) == (2, [0, 2])


def test_new_input_keeps_valid_choices_and_resets_the_rest(view):
    view.layer, view.heads, view.pair_filter = 2, [1, 3], "a->b"
    view.set_attention(softmax_attention(3, 4, 5, seed=1), TOKENS[:5])
    assert (view.layer, view.heads, view.pair_filter) == (2, [1, 3], "all")  # no sentence B any more
    assert view.tokens == TOKENS[:5] and view.shape == [3, 4, 5, 5]
    view.set_attention(softmax_attention(1, 2, 5, seed=2), TOKENS[:5])
    assert (view.layer, view.heads) == (0, [1])


def test_sentence_b_start_must_fall_inside_the_tokens():
    attn = softmax_attention(1, 1, len(TOKENS))
    for bad in (0, len(TOKENS)):
        with pytest.raises(ValueError, match="sentence_b_start"):
            AttentionView(attn, TOKENS, sentence_b_start=bad)


def test_static_files_are_package_data_and_the_module_parses():
    static = Path(bertlab.viz.__file__).parent / "static"
    esm = (static / "attention_view.js").read_text(encoding="utf-8")
    assert str(AttentionView._esm) == esm and str(AttentionView._css) == (static / "attention_view.css").read_text()
    assert esm.count("export default { render };") == 1
    assert not re.search(r"\bimport\b[^;]*\bfrom\b", esm), "the view must not import anything"
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", esm), "no URL but the SVG namespace"
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: JS syntax not checked")
    result = subprocess.run([node, "--input-type=module", "--check"], input=esm, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- standalone HTML -------------------------------------------------------------------------------

def _embedded_state(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="bertlab-attention-state">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_standalone_html_is_self_contained():
    attn = softmax_attention(2, 3, len(TOKENS))
    page = to_standalone_html(attn, TOKENS, B_START, layer=1, heads=[2], title="cat & mat")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=""", page), "nothing may be loaded from elsewhere"
    assert "@import" not in page and "url(" not in page
    assert "export default" not in page  # the module is inlined as a classic script
    assert "bertlabAttentionView.render" in page and ".bl-attn" in page
    assert "cat &amp; mat" in page
    state = _embedded_state(page)
    assert state["tokens"] == TOKENS and state["sentence_b_start"] == B_START
    assert (state["layer"], state["heads"]) == (1, [2])
    back = expand_attention(base64.b64decode(state["data"]), state["shape"], state["scale"])
    assert float((back - attn).abs().max()) <= 1 / 255


def test_standalone_scripts_parse_as_classic_scripts():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: JS syntax not checked")
    page = to_standalone_html(softmax_attention(1, 2, 4), TOKENS[:4])
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 2  # the view, then the stand-in model that starts it
    for script in scripts:
        result = subprocess.run([node, "--input-type=commonjs", "--check"], input=script, text=True,
                                capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr


def test_standalone_html_escapes_tokens_that_look_like_markup():
    tokens = ["[CLS]", "</script><b>x</b>", "&amp;", "[SEP]"]
    page = to_standalone_html(softmax_attention(1, 1, 4), tokens)
    assert "</script><b>" not in page
    assert _embedded_state(page)["tokens"] == tokens


def test_widget_exports_its_current_state(view):
    view.layer, view.heads, view.view = 1, [0, 3], "model"
    state = _embedded_state(view.to_html())
    assert (state["layer"], state["heads"], state["view"]) == (1, [0, 3], "model")
    assert base64.b64decode(state["data"]) == view.data


def test_numpy_float16_input_is_accepted():
    attn = softmax_attention(1, 2, 4).numpy().astype(np.float16)
    widget = AttentionView(attn, TOKENS[:4])
    try:
        assert widget.shape == [1, 2, 4, 4]
    finally:
        widget.close()
