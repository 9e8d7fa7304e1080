"""bertviz made to work offline, without a browser: inlined libraries, no CDN, smaller payload."""

from __future__ import annotations

import html
import importlib.util
import json
import re

import ipywidgets
import pytest
import torch

from bertlab.viz import bertviz_offline
from bertlab.viz.bertviz_offline import (
    OfflineLibraryError,
    bertviz_head_view,
    bertviz_html,
    bertviz_model_view,
    offline_libraries,
)

TOKENS = "[CLS] the cat sat on the mat . [SEP] it was happy [SEP]".split()
B_START = 9
CDN_HOSTS = ("cdnjs.cloudflare.com", "cdn.jsdelivr.net", "unpkg.com", "code.jquery.com", "d3js.org/d3")

pytest.importorskip("bertviz")
if importlib.util.find_spec("mpld3") is None or importlib.util.find_spec("nbclassic") is None:
    pytest.skip("mpld3 and nbclassic (they ship d3, jQuery, require.js) are not installed", allow_module_level=True)


def softmax_attention(layers: int, heads: int, seq: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(layers, heads, seq, seq, generator=g) * 2).softmax(-1)


def params_of(page: str) -> dict:
    """bertviz's params as the page's JS sees them (JS numbers like .25 made JSON again)."""
    match = re.search(r"const params = (\{.*?\});\n", page, re.S)
    assert match is not None
    return json.loads(re.sub(r"(?<=[\[,])\.(?=\d)", "0.", match.group(1)))


def test_libraries_come_from_installed_packages():
    libs = offline_libraries()
    assert set(libs) == {"d3", "jquery", "require"}
    assert "d3js.org v5" in libs["d3"][:200]  # the major version bertviz's JS is written for
    assert "jQuery" in libs["jquery"] and "define(\"jquery\"" in libs["jquery"]
    assert "RequireJS" in libs["require"][:300]


def test_missing_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpld3" else real(name, *a))
    with pytest.raises(OfflineLibraryError, match="pip install mpld3"):
        offline_libraries()


@pytest.mark.parametrize("view", ["head", "model"])
def test_page_carries_its_libraries_and_asks_no_cdn(view):
    page = bertviz_html(softmax_attention(2, 3, len(TOKENS)), TOKENS, B_START, view=view)
    libs = offline_libraries()
    for host in CDN_HOSTS:
        assert host not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "every script must be inline"
    assert not re.search(r"require\.config\(\{\s*paths", page), "bertviz's CDN paths must be gone"
    for name in ("d3", "jquery", "require"):
        assert libs[name][:2000].replace("</", "<\\/") in page
    assert page.index("d3js.org v5") < page.index("RequireJS") < page.index("define('d3'")
    assert page.index("define('d3'") < page.index("requirejs(['jquery', 'd3']")
    assert page.count("const params = ") == 1  # bertviz writes a second copy in a comment: dropped


def test_weights_are_rounded_to_three_decimals():
    attn = softmax_attention(2, 3, len(TOKENS))
    params = params_of(bertviz_html(attn, TOKENS))
    sent = torch.tensor(params["attention"][0]["attn"], dtype=torch.float64)
    assert sent.shape == attn.shape
    assert torch.allclose(sent, torch.round(attn.double(), decimals=3), atol=1e-12)
    assert float((sent - attn.double()).abs().max()) <= 0.0005 + 1e-9
    assert params["attention"][0]["left_text"] == TOKENS


def test_sentence_pair_views_and_options_reach_bertviz():
    attn = softmax_attention(3, 2, len(TOKENS))
    params = params_of(bertviz_html(attn, TOKENS, B_START, layer=2, heads=[1]))
    names = [entry["name"] for entry in params["attention"]]
    assert names == ["All", "Sentence A -> Sentence A", "Sentence B -> Sentence B",
                     "Sentence A -> Sentence B", "Sentence B -> Sentence A"]
    a_to_b = torch.tensor(params["attention"][3]["attn"])
    assert a_to_b.shape == (3, 2, B_START, len(TOKENS) - B_START)
    assert (params["layer"], params["heads"]) == (2, [1])


def test_fewer_decimals_make_a_smaller_page():
    attn = softmax_attention(2, 4, 40)
    tokens = [f"t{i}" for i in range(40)]
    assert len(bertviz_html(attn, tokens, decimals=2)) < len(bertviz_html(attn, tokens, decimals=3))


def test_widgets_show_the_page_in_an_iframe():
    attn = softmax_attention(2, 3, len(TOKENS))
    for widget in (bertviz_head_view(attn, TOKENS, B_START), bertviz_model_view(attn, TOKENS, include_heads=[0, 2])):
        assert isinstance(widget, ipywidgets.HTML)
        match = re.fullmatch(r'<iframe class="bertlab-bertviz" srcdoc="([^"]*)" '
                             r'style="[^"]*" title="bertviz"></iframe>',
                             widget.value)
        assert match is not None
        page = html.unescape(match.group(1))
        assert page.startswith("<!DOCTYPE html>") and "window.frameElement" in page
        widget.close()
    assert params_of(page)["include_heads"] == [0, 2]


def test_bad_input_fails_before_bertviz_runs():
    attn = softmax_attention(1, 2, len(TOKENS))
    with pytest.raises(ValueError, match="tokens"):
        bertviz_html(attn, TOKENS[:-1])
    with pytest.raises(ValueError, match="sentence_b_start"):
        bertviz_html(attn, TOKENS, sentence_b_start=0)
    with pytest.raises(ValueError, match="view must be"):
        bertviz_html(attn, TOKENS, view="neuron")


def test_unknown_bertviz_html_is_reported():
    with pytest.raises(RuntimeError, match="not supported"):
        bertviz_offline._inline_libraries("<div>no scripts here</div>", offline_libraries())


def test_payload_for_128_tokens_and_72_heads_shrinks_tenfold():
    """MiniLM's shape (6 layers x 12 heads) at 128 tokens: bertviz alone sends ~53 MB."""
    attn = softmax_attention(6, 12, 128)
    tokens = [f"t{i}" for i in range(128)]
    page = bertviz_html(attn, tokens)
    weights = attn.numel()
    assert len(page) < 6 * 1024 * 1024
    assert len(page) < 4.5 * weights + 1024 * 1024  # about 4 characters per weight + the libraries


@pytest.mark.slow
def test_payload_before_and_after_for_128_tokens_and_144_heads():
    """bert-base's shape (12 x 12): bertviz's own page against the offline one (report figures)."""
    import bertviz

    attn = softmax_attention(12, 12, 128)
    tokens = [f"t{i}" for i in range(128)]
    before = len(bertviz.head_view([layer.unsqueeze(0) for layer in attn], tokens, html_action="return").data)
    after = len(bertviz_html(attn, tokens))
    assert before > 100e6  # every weight written twice, as 18-digit floats
    assert after < before / 10


@pytest.mark.parametrize("view", ["head", "model"])
def test_page_shows_a_busy_sign_until_bertviz_has_drawn(view):
    """bertviz on 128 tokens left the frame blank for seconds."""
    page = bertviz_html(softmax_attention(2, 3, len(TOKENS)), TOKENS, B_START, view=view)
    sign = page.index('id="bertlab-loading"')
    assert sign < page.index("d3js.org v5")  # before the libraries: it shows while they are parsed
    assert "Drawing bertviz's view…" in page and "@keyframes bertlab-spin" in page
    assert 'querySelector("svg *")' in page and '.remove()' in page  # gone once bertviz has drawn
