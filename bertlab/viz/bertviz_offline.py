"""bertviz's head view and model view, working offline in Voila and JupyterLab.

bertviz's HTML asks a CDN for require.js, d3 and jQuery, so offline it shows "require is not
defined" or an empty box. Here its HTML (`html_action="return"`) is rewritten to carry those
libraries inline, read at run time from installed registry packages (no third-party JS is
kept in bertlab): d3 5.7 from `mpld3`, jQuery and require.js from `nbclassic`. The page is shown
in an `<iframe srcdoc=...>` inside an `ipywidgets.HTML` (plain `ipywidgets.HTML` never runs
scripts; an iframe's page does). Weights are rounded (3 decimals by default) and written as
short JS numbers, which cuts bertviz's payload about fourfold.

    widget = bertviz_head_view(attn, tokens, sentence_b_start=7)   # attn: [layers, heads, seq, seq]
    Path("attention.html").write_text(bertviz_html(attn, tokens, view="model"))
"""

from __future__ import annotations

import html
import importlib.util
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets
import numpy as np
import torch

from bertlab.viz.attention_view import AttentionLike, _check_pair_start, _script_text, as_attention

logger = logging.getLogger(__name__)

# (package, path inside it) of each library bertviz's JS asks require.js for.
LIBRARY_FILES: dict[str, tuple[str, str]] = {
    "d3": ("mpld3", "js/d3.v5.min.js"),
    "jquery": ("nbclassic", "static/components/jquery/jquery.min.js"),
    "require": ("nbclassic", "static/components/requirejs/require.js"),
}
BERTVIZ_VIEWS = ("head", "model")
_REQUIRE_CONFIG = re.compile(r"require\.config\(\{.*?\}\);", re.DOTALL)
_CDN_SCRIPT = re.compile(r"<script\s+src=\"https?://[^\"]*\"\s*>\s*</script>")
_PARAMS = re.compile(r"const params = (\{.*?\}); // HACK[^\n]*\n", re.DOTALL)
# Lines a model view draws (layers x heads x query x key) above which the browser slows down.
MODEL_VIEW_LINE_WARNING = 400_000


class OfflineLibraryError(RuntimeError):
    """A JS library bertviz needs is not installed locally."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise OfflineLibraryError(
            f"bertviz needs JS that the '{package}' package ships; install it with "
            f"`pip install {package}` (bertlab uses mpld3 for d3 and nbclassic for jQuery/require.js)."
        )
    return Path(list(spec.submodule_search_locations)[0])


def offline_libraries() -> dict[str, str]:
    """Source text of d3, jQuery and require.js, read from installed packages."""
    sources = {}
    for name, (package, relative) in LIBRARY_FILES.items():
        path = _package_dir(package) / relative
        if not path.is_file():
            raise OfflineLibraryError(f"{path} is missing; reinstall '{package}' (`pip install -U {package}`).")
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def _rounded_layers(attn: torch.Tensor, decimals: int) -> list[torch.Tensor]:
    """bertviz's input: one `[1, head, q, k]` float64 tensor per layer, rounded.

    float64 makes `json.dumps` write 0.123 rather than 0.12300000339746475.
    """
    rounded = torch.round(attn.to(torch.float64), decimals=decimals)  # [layer, head, q, k]
    return [layer.unsqueeze(0) for layer in rounded]


def _number_table(decimals: int) -> np.ndarray:
    """JS text of k / 10**decimals for k = 0..10**decimals: "0", ".001", ..., "1"."""
    scale = 10**decimals
    texts = ["0"] + [f"{k / scale:.{decimals}f}".rstrip("0").lstrip("0") for k in range(1, scale)] + ["1"]
    return np.array(texts, dtype=object)


def _js_array(steps: np.ndarray, table: np.ndarray) -> str:
    """Nested JS array literal of `table[steps]` (steps: int array, any number of dims)."""
    if steps.ndim == 1:
        return "[" + ",".join(table[steps]) + "]"
    return "[" + ",".join(_js_array(part, table) for part in steps) + "]"


def _compact_params(page: str, decimals: int) -> str:
    """Re-write bertviz's `const params = {...}` with short numbers and no spaces.

    bertviz writes its params twice (the second copy in a comment): keep only the first.
    """
    match = _PARAMS.search(page)
    if match is None:
        raise RuntimeError("bertviz's HTML has no `const params = ...`; this bertviz version is not supported.")
    params = json.loads(match.group(1))
    table = _number_table(decimals)
    entries = []
    for entry in params.pop("attention"):
        weights = np.asarray(entry.pop("attn"), dtype=np.float64)  # [layer, head, query, key]
        steps = np.rint(np.clip(weights, 0.0, 1.0) * 10**decimals).astype(np.int64)
        head = json.dumps(entry, separators=(",", ":"))
        entries.append(head[:-1] + ',"attn":' + _js_array(steps, table) + "}")
    rest = json.dumps(params, separators=(",", ":"))
    compact = '{"attention":[' + ",".join(entries) + "]," + rest[1:]
    return page[: match.start()] + f"const params = {compact};\n" + page[match.end() :]


def _inline_libraries(page: str, libraries: dict[str, str]) -> str:
    """Swap bertviz's CDN `<script src>` and `require.config(...)` for inline libraries."""
    page, n_cdn = _CDN_SCRIPT.subn("", page)
    page, n_config = _REQUIRE_CONFIG.subn("", page)
    if n_cdn != 1 or n_config != 1:
        raise RuntimeError(
            f"bertviz's HTML changed shape (found {n_cdn} CDN script tags and {n_config} require.config calls, "
            "expected 1 of each); this bertviz version is not supported offline."
        )
    # d3 and jQuery load before require.js so they set window.d3 / window.jQuery instead of
    # registering anonymous AMD modules; then they are named for require() by hand.
    head = "".join(
        f"<script>/* {name}: read from the installed '{LIBRARY_FILES[name][0]}' package */\n"
        f"{_script_text(libraries[name])}\n</script>\n"
        for name in ("d3", "jquery", "require")
    )
    shim = (
        "<script>define('d3', [], function () { return window.d3; });"
        "define('jquery', [], function () { return window.jQuery; });</script>\n"
    )
    return head + shim + page


_FIT_FRAME = """<script>
(function () {  // shrink a page wider than its iframe to fit (bertviz's model view is ~970 px wide),
  // then grow the iframe to the page's height
  function fit() {
    var frame = window.frameElement, root = document.documentElement, body = document.body;
    if (!frame) return;
    body.style.zoom = "";
    var wide = root.scrollWidth, room = root.clientWidth;
    if (wide > room + 1) body.style.zoom = String(Math.max(0.5, (room - 2) / wide));
    frame.style.height = (root.scrollHeight + 4) + "px";
  }
  if (window.ResizeObserver) new ResizeObserver(fit).observe(document.body);
  window.addEventListener("load", fit);
})();
</script>"""


# bertviz draws a few seconds after the page arrives (longer on 128 tokens): a sign says it is coming,
# until its first drawing (an SVG with content) appears. First in the body, so it shows before the
# libraries are parsed.
_LOADING = """<div id="bertlab-loading" style="position:absolute;top:8px;left:8px;font:14px sans-serif;color:#1f3b57">
<style>@keyframes bertlab-spin{to{transform:rotate(360deg)}}</style>
<span style="display:inline-block;width:0.9em;height:0.9em;margin-right:0.5em;vertical-align:-0.1em;
border:2px solid #4a90d9;border-right-color:transparent;border-radius:50%;animation:bertlab-spin 0.8s linear infinite">
</span>Drawing bertviz's view…</div>
<script>
(function () {  // take the sign away once bertviz has drawn (or after a minute)
  var started = Date.now();
  var timer = setInterval(function () {
    if (document.querySelector("svg *") || Date.now() - started > 60000) {
      var sign = document.getElementById("bertlab-loading");
      if (sign) sign.remove();
      clearInterval(timer);
    }
  }, 100);
})();
</script>"""


def bertviz_html(
    attention: AttentionLike,
    tokens: Sequence[str],
    sentence_b_start: int | None = None,
    *,
    view: str = "head",
    decimals: int = 3,
    title: str = "bertviz",
    **bertviz_kwargs: Any,
) -> str:
    """bertviz's head or model view as one self-contained HTML page that works offline.

    `attention` is `[layer, head, query, key]` (or a list per layer); extra keyword arguments
    go to `bertviz.head_view` / `bertviz.model_view` (e.g. `layer`, `heads`, `include_layers`,
    `include_heads`, `display_mode`). Weights are rounded to `decimals` places.
    """
    import bertviz

    if view not in BERTVIZ_VIEWS:
        raise ValueError(f"view must be one of {BERTVIZ_VIEWS}, not {view!r}.")
    attn = as_attention(attention, tokens)
    _check_pair_start(sentence_b_start, len(tokens))
    libraries = offline_libraries()
    if view == "model" and attn.numel() > MODEL_VIEW_LINE_WARNING:
        logger.warning(
            "bertviz's model view will draw %d lines and may take long to show; "
            "pass include_layers=[...] / include_heads=[...] or fewer tokens.",
            attn.numel(),
        )
    render = bertviz.head_view if view == "head" else bertviz.model_view
    page = render(
        _rounded_layers(attn, decimals), list(tokens), sentence_b_start, html_action="return", **bertviz_kwargs
    ).data
    body = _inline_libraries(_compact_params(page, decimals), libraries)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{_LOADING}\n{body}\n{_FIT_FRAME}\n</body>\n</html>\n"
    )


def iframe_widget(page: str, height: int = 400) -> ipywidgets.HTML:
    """An `ipywidgets.HTML` that shows `page` in an `<iframe srcdoc>`, so its scripts run."""
    frame = (
        f'<iframe class="bertlab-bertviz" srcdoc="{html.escape(page, quote=True)}" '
        f'style="width: 100%; height: {int(height)}px; border: 0;" title="bertviz"></iframe>'
    )
    return ipywidgets.HTML(value=frame, layout=ipywidgets.Layout(width="100%"))


def bertviz_head_view(
    attention: AttentionLike,
    tokens: Sequence[str],
    sentence_b_start: int | None = None,
    *,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    include_layers: Sequence[int] | None = None,
    decimals: int = 3,
) -> ipywidgets.HTML:
    """bertviz's head view as a widget that works offline (Voila, JupyterLab)."""
    page = bertviz_html(
        attention, tokens, sentence_b_start, view="head", decimals=decimals,
        layer=layer, heads=None if heads is None else list(heads),
        include_layers=None if include_layers is None else list(include_layers),
    )
    return iframe_widget(page, height=60 + 23 * len(tokens))


def bertviz_model_view(
    attention: AttentionLike,
    tokens: Sequence[str],
    sentence_b_start: int | None = None,
    *,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    display_mode: str = "light",
    decimals: int = 3,
) -> ipywidgets.HTML:
    """bertviz's model view as a widget that works offline (Voila, JupyterLab)."""
    attn = as_attention(attention, tokens)  # [layer, head, query, key]
    n_layers = len(include_layers) if include_layers is not None else attn.shape[0]
    page = bertviz_html(
        attn, tokens, sentence_b_start, view="model", decimals=decimals, display_mode=display_mode,
        include_layers=None if include_layers is None else list(include_layers),
        include_heads=None if include_heads is None else list(include_heads),
    )
    return iframe_widget(page, height=80 + 90 * n_layers)


def bertviz_page(attention: AttentionLike, tokens: Sequence[str], sentence_b_start: int | None = None,
                 kind: str = "head view", layer: int | None = None) -> str:
    """The frame (HTML) of bertviz's "head view" (opening at `layer`) or "model view"; ValueError, with a
    sentence the student can act on, when bertviz cannot be shown here."""
    try:
        if kind == "head view":
            return bertviz_head_view(attention, tokens, sentence_b_start, layer=layer).value
        return bertviz_model_view(attention, tokens, sentence_b_start).value
    except (ImportError, OfflineLibraryError) as e:
        raise ValueError(f"bertviz cannot be shown here: {e} The other views work without it.") from e
