"""Attention head view and model view as an anywidget that works offline.

The view takes what bertviz takes: attention `[layer, head, query, key]` (or a list with one
`[head, query, key]` per layer), the tokens, and where sentence B starts. The weights travel to
the browser as uint8 bytes (zlib-deflated when that is shorter), not as JSON floats, so 128
tokens x 144 heads stay well under 2 MB. The JavaScript and CSS are bertlab's own package data
(`bertlab/viz/static/`); nothing is fetched from a CDN.

    view = AttentionView(attn, tokens, sentence_b_start=7)   # attn: [layers, heads, seq, seq]
    view.layer = 3; view.heads = [0, 5]; view.view = "model"
    html = to_standalone_html(attn, tokens)                   # one self-contained file
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import torch
import traitlets

logger = logging.getLogger(__name__)

AttentionLike = torch.Tensor | np.ndarray | Sequence[torch.Tensor] | Sequence[np.ndarray]

VIEWS = ("head", "model")
PAIR_FILTERS = ("all", "a->a", "b->b", "a->b", "b->a")
PAYLOAD_BUDGET = 2 * 1024 * 1024  # bytes of attention data the widget aims to send
_STATIC = Path(__file__).parent / "static"
_ESM_EXPORT = "export default { render };"


def _static_text(name: str) -> str:
    """Text of a file shipped in `bertlab/viz/static/`."""
    return (_STATIC / name).read_text(encoding="utf-8")


def as_attention(attention: AttentionLike, tokens: Sequence[str] | None = None) -> torch.Tensor:
    """Attention of one example as a float32 CPU tensor `[layer, head, query, key]`.

    Accepts `[layer, head, q, k]`, `[layer, 1, head, q, k]` (e.g. `cache.stack("hook_pattern")`
    for a batch of one), or a list per layer of `[head, q, k]` / `[1, head, q, k]` (what
    `output_attentions=True` returns). Checks the weights are finite and non-negative and,
    when `tokens` is given, that there is one query and one key per token.
    """
    if isinstance(attention, (list, tuple)):
        if not attention:
            raise ValueError("attention is an empty list: pass one [head, query, key] tensor per layer.")
        attention = torch.stack([torch.as_tensor(a) for a in attention])
    attn = torch.as_tensor(attention).detach().to("cpu", torch.float32)
    if attn.dim() == 5:
        if attn.shape[1] != 1:
            raise ValueError(
                f"attention {tuple(attn.shape)} holds a batch of {attn.shape[1]} examples; "
                "pick one, e.g. attention[:, i] for example i."
            )
        attn = attn[:, 0]
    if attn.dim() != 4:
        raise ValueError(
            f"attention has shape {tuple(attn.shape)}; expected [layer, head, query, key] "
            "or a list with one [head, query, key] tensor per layer."
        )
    if min(attn.shape) == 0:
        raise ValueError(f"attention {tuple(attn.shape)} is empty.")
    if not torch.isfinite(attn).all():
        raise ValueError("attention holds NaN or inf values; check the model run that produced it.")
    if (attn < 0).any():
        raise ValueError("attention weights must be >= 0 (softmax outputs); got negative values.")
    if tokens is not None and (attn.shape[-2] != len(tokens) or attn.shape[-1] != len(tokens)):
        raise ValueError(
            f"attention covers {attn.shape[-2]} queries x {attn.shape[-1]} keys but {len(tokens)} tokens "
            "were given; drop padding positions or pass the tokens of this very input."
        )
    return attn


def _check_pair_start(sentence_b_start: int | None, n_tokens: int) -> None:
    if sentence_b_start is not None and not 0 < sentence_b_start < n_tokens:
        raise ValueError(
            f"sentence_b_start={sentence_b_start} must be the index of the first token of sentence B, "
            f"between 1 and {n_tokens - 1}; use None for a single sentence."
        )


def compact_attention(attention: AttentionLike, *, compress: bool = True) -> tuple[bytes, tuple[int, ...], float]:
    """Quantise attention to one byte per weight: `(data, shape, scale)`.

    `weight ~= byte * scale / 255` with `scale` = the largest weight, so the error is at most
    `scale / 510` (<= 1/510 for softmax weights). Bytes are row-major over `shape`
    `[layer, head, query, key]`. With `compress`, the bytes are zlib-deflated when that makes
    them shorter; `len(data) < prod(shape)` tells the two apart.
    """
    attn = as_attention(attention)
    scale = float(attn.max())
    if scale == 0.0:
        scale = 1.0
    quantised = torch.round(attn * (255.0 / scale)).clamp_(0, 255).to(torch.uint8)
    raw = quantised.numpy().tobytes()
    data = raw
    if compress:
        deflated = zlib.compress(raw, 6)
        data = deflated if len(deflated) < len(raw) else raw
    return data, tuple(attn.shape), scale


def expand_attention(data: bytes, shape: Sequence[int], scale: float) -> torch.Tensor:
    """Inverse of `compact_attention`: float32 `[layer, head, query, key]`."""
    n = math.prod(shape)
    raw = bytes(data)
    if len(raw) < n:
        try:
            raw = zlib.decompress(raw)
        except zlib.error as err:
            raise ValueError(
                f"attention data ({len(raw)} bytes) is neither {n} weights nor zlib data for shape {tuple(shape)}."
            ) from err
    if len(raw) != n:
        raise ValueError(f"attention data holds {len(raw)} weights but shape {tuple(shape)} needs {n}.")
    quantised = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(tuple(shape))
    return quantised.to(torch.float32) * (scale / 255.0)


def _input_state(
    attention: AttentionLike, tokens: Sequence[str], sentence_b_start: int | None, compress: bool
) -> dict[str, Any]:
    """The widget traits that describe one input: data, shape, scale, tokens, sentence_b_start."""
    attn = as_attention(attention, tokens)
    _check_pair_start(sentence_b_start, len(tokens))
    data, shape, scale = compact_attention(attn, compress=compress)
    if len(data) > PAYLOAD_BUDGET:
        logger.warning("attention view sends %.1f MB; pass fewer layers or tokens", len(data) / 2**20)
    return {
        "data": data, "shape": list(shape), "scale": scale,
        "tokens": [str(t) for t in tokens], "sentence_b_start": sentence_b_start,
    }


def _check_layer(layer: int, n_layers: int) -> int:
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} does not exist; pick 0..{n_layers - 1}.")
    return layer


def _check_heads(heads: Sequence[int], n_heads: int) -> list[int]:
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"heads {bad} do not exist; pick from 0..{n_heads - 1}.")
    return sorted(set(heads))


class AttentionView(anywidget.AnyWidget):
    """Head view and model view of one input's attention (anywidget, offline).

    `view` picks "head" (token columns joined by lines, opacity = weight / heads shown; hover a
    token to see only its lines) or "model" (layers x heads thumbnails; click one to open it).
    `layer`, `heads` (shown heads) and `pair_filter` mirror the controls in the browser; `controls`
    False leaves the choice of view and layer to the page around it.
    """

    _esm = _STATIC / "attention_view.js"
    _css = _STATIC / "attention_view.css"

    data = traitlets.Bytes(b"").tag(sync=True)  # uint8 [layer, head, query, key], maybe deflated
    shape = traitlets.List(traitlets.Int(), default_value=[1, 1, 1, 1]).tag(sync=True)
    scale = traitlets.Float(1.0).tag(sync=True)  # weight = byte * scale / 255
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    sentence_b_start = traitlets.Int(None, allow_none=True).tag(sync=True)
    view = traitlets.Enum(VIEWS, default_value="head").tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    heads = traitlets.List(traitlets.Int()).tag(sync=True)
    pair_filter = traitlets.Enum(PAIR_FILTERS, default_value="all").tag(sync=True)
    # False: no Head view / Model view buttons and no Layer drop-down (a panel around it has its own, and
    # one set of controls is all a student should see); the head chips and the pair filter stay.
    controls = traitlets.Bool(True).tag(sync=True)

    def __init__(
        self,
        attention: AttentionLike,
        tokens: Sequence[str],
        sentence_b_start: int | None = None,
        *,
        layer: int = 0,
        heads: Sequence[int] | None = None,
        view: str = "head",
        compress: bool = True,
        **kwargs: Any,
    ) -> None:
        self._compress = compress
        state = _input_state(attention, tokens, sentence_b_start, compress)
        n_heads = state["shape"][1]
        heads = list(range(n_heads)) if heads is None else list(heads)
        # One comm message carries everything: traitlets validates layer/heads after all are set.
        super().__init__(**state, layer=layer, heads=heads, view=view, **kwargs)

    def set_attention(
        self, attention: AttentionLike, tokens: Sequence[str], sentence_b_start: int | None = None
    ) -> None:
        """Show a new input; keeps layer and heads when they still exist."""
        state = _input_state(attention, tokens, sentence_b_start, self._compress)
        n_layers, n_heads = state["shape"][:2]
        kept = [h for h in self.heads if h < n_heads]
        state["heads"] = kept if kept else list(range(n_heads))
        state["layer"] = self.layer if self.layer < n_layers else 0
        if sentence_b_start is None:
            state["pair_filter"] = "all"
        with self.hold_sync(), self.hold_trait_notifications():
            for name, value in state.items():
                setattr(self, name, value)

    @traitlets.validate("layer")
    def _valid_layer(self, proposal: dict) -> int:
        try:
            return _check_layer(proposal["value"], self.shape[0])
        except ValueError as err:
            raise traitlets.TraitError(str(err)) from None

    @traitlets.validate("heads")
    def _valid_heads(self, proposal: dict) -> list[int]:
        try:
            return _check_heads(proposal["value"], self.shape[1])
        except ValueError as err:
            raise traitlets.TraitError(str(err)) from None

    @property
    def attention(self) -> torch.Tensor:
        """The weights as the browser sees them, float32 `[layer, head, query, key]`."""
        return expand_attention(self.data, self.shape, self.scale)

    def to_html(self, title: str = "Attention") -> str:
        """This view, in its current state, as one self-contained HTML page."""
        names = ("data", "shape", "scale", "tokens", "sentence_b_start", "view", "layer", "heads", "pair_filter")
        return _standalone_page({name: getattr(self, name) for name in names}, title)


def to_standalone_html(
    attention: AttentionLike,
    tokens: Sequence[str],
    sentence_b_start: int | None = None,
    *,
    layer: int = 0,
    heads: Sequence[int] | None = None,
    view: str = "head",
    title: str = "Attention",
) -> str:
    """The attention view as one HTML page (inline JS/CSS, data embedded) that opens offline."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, not {view!r}.")
    state = _input_state(attention, tokens, sentence_b_start, compress=True)
    n_layers, n_heads = state["shape"][:2]
    state.update(
        view=view, layer=_check_layer(layer, n_layers), pair_filter="all",
        heads=_check_heads(range(n_heads) if heads is None else heads, n_heads),
    )
    return _standalone_page(state, title)


def _script_text(source: str) -> str:
    """Make text safe inside <script>...</script>."""
    return source.replace("</", "<\\/").replace("<!--", "<\\!--")


def _standalone_page(state: dict[str, Any], title: str) -> str:
    """One HTML page: the view's CSS and JS inline, `state` (widget traits) embedded as JSON."""
    state = {**state, "data": base64.b64encode(state["data"]).decode("ascii")}
    module = _static_text("attention_view.js")
    if module.count(_ESM_EXPORT) != 1:
        raise RuntimeError("attention_view.js must end with a single `export default { render };`")
    classic = module.replace(_ESM_EXPORT, "return { render };")
    state_json = json.dumps(state, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
    state_json = state_json.replace("&", "\\u0026")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n"
        f"<style>\nbody {{ margin: 16px; }}\n{_static_text('attention_view.css')}\n</style>\n</head>\n<body>\n"
        f"<h3 style=\"font-family: system-ui, sans-serif\">{html.escape(title)}</h3>\n"
        "<div id=\"bertlab-attention\"></div>\n"
        f"<script type=\"application/json\" id=\"bertlab-attention-state\">{state_json}</script>\n"
        f"<script>\nconst bertlabAttentionView = (function () {{\n{_script_text(classic)}\n}})();\n</script>\n"
        f"<script>\n{_script_text(_static_text('standalone.js'))}\n</script>\n"
        "</body>\n</html>\n"
    )


def attention_page(result: Any, limit: int = 80) -> tuple[str, str]:
    """(title, page) of an attention result's (`analysis.attention.AttentionResult`) standalone head and
    model view, titled "Attention: A / B" on one line of at most `limit` characters."""
    title = " ".join((f"Attention: {result.text_a}" + (f" / {result.text_b}" if result.text_b else "")).split())
    title = title if len(title) <= limit else title[: limit - 1] + "…"
    return title, to_standalone_html(result.patterns, result.tokens, result.sentence_b_start, title=title)
