"""How the dashboard looks, in one place: the normal page and projector mode.

Projector mode is for a lecture hall: text, token chips, figures and their fonts ×1.5, figures
that can stretch as wide as the tab, colour scales that keep their contrast on a washed-out
projector, and head-view lines drawn stronger. Both themes use colour-blind-safe colours.

- Figure builders draw with the theme in use (`current()`, or one passed to them) and end with
  `finish(fig, theme)`, which scales every font, margin and height, and lets the figure fill the
  tab's width (`wide=False` figures, whose width follows their tokens, keep a fixed width and
  scroll instead).
- `thin_ticks` draws at most as many axis labels as fit (big matrices); `labelled_points` picks
  the points of a 2-D map that get a label drawn (not only on hover).
- The app switches the theme with `use()`, adds `css()` to the page once, and puts `ROOT_CLASS`
  (and `PROJECTOR_CLASS` in projector mode) on its root widget: widget text and the attention
  view's lines follow through CSS variables.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import plotly.graph_objects as go

from bertlab.viz.text import plain_figure

# Okabe & Ito's palette (colour-blind safe), strongest colours first; yellow last (weak on white).
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
NEUTRAL = "#8c8c8c"  # "other", baselines, not-scored cells
ROOT_CLASS = "bertlab-app"
PROJECTOR_CLASS = "bertlab-projector"
BASE_FONT = 12  # plotly's default text size, px, on the normal page
HOVER_FONT = 13
MIN_PAGE_WIDTH = 320  # px: a figure is never drawn narrower than this, however narrow the page
DEFAULT_HEIGHT = 450  # px: plotly's height for a figure that sets none
MAX_HEIGHT = 1000  # px: projector mode grows a figure's height ×scale up to this (never shrinks one)
MUTED = "color:#555"  # help lines and notes (projector mode darkens it, see `css`)
HELP_STYLE = MUTED + ";font-size:0.9em"  # a tab's help line, a setting's note
FAINT = "color:#777"  # what shows before there is anything ("No run yet.")
TEXT_CHAR_EM = 0.62  # a label's average character width, in em, with room to spare (plotly's Open Sans: ~0.55)
TAB_CHAR_EM = 0.56  # a tab title's average character width, in em of its font (DejaVu Sans, Arial: ~0.53)
MIN_TAB_FONT = 9  # px: the tab bar's titles shrink down to this to stay on one row
# The page's colours outside figures, in one place: panels use these (or `help_html`, `note_html`), never a
# colour literal of their own.
NOTE_EDGE = {"info": "#4a90d9", "warning": "#e0a100", "error": "#d62728"}  # a note's left edge, by level
NOTE_STYLE = {  # a note's text, background and edge, by level (info, warning, error)
    "info": f"color:#1f3b57;background:#eef4fa;border-left:4px solid {NOTE_EDGE['info']}",
    "warning": f"color:#5c3d00;background:#fff6e0;border-left:4px solid {NOTE_EDGE['warning']}",
    "error": f"color:#6b0b0b;background:#fdecec;border-left:4px solid {NOTE_EDGE['error']}",
}
BUSY_COLOUR = "#1f3b57"  # the busy sign's text; its spinner is drawn in NOTE_EDGE["info"]
BOX_BORDER = "1px solid #ddd"  # a framed box of widgets (a details pane, the model card)
OK_TEXT, OFF_TEXT = "color:#1a7f37", "color:#888"  # a thing the model has (✓) or lacks (✗)
HIDDEN_MARK = "background:#ffe08a;border-radius:3px;padding:0 2px;font-weight:600"  # a hidden ([MASK]) piece


@dataclass(frozen=True)
class Theme:
    """Sizes and colours of one look. Sizes in figure builders are written for the normal page
    and multiplied by `scale` (see `px` and `finish`)."""

    name: str
    scale: float = 1.0  # text, chips and figures, relative to the normal page
    full_width: bool = False  # figures that can stretch use the tab's whole width...
    page_width: int = 960  # ...this many px (the app sets what the page reports)
    sequential: str = "Blues"  # colour scale for 0..max (attention weights, probabilities, shares)
    diverging: str = "RdBu"  # colour scale for signed values (red-blue: safe for red-green colour blindness)
    palette: tuple[str, ...] = OKABE_ITO  # one colour per category (heads, parts, words, runs)
    labelled_points: int = 12  # points of a 2-D map with their label drawn
    line_gain: float = 1.6  # head-view line opacity = gain × weight / sqrt(heads shown), at most 1
    label_gap: float = 1.5  # an axis label needs this many times its font size of room
    segment_fill: tuple[str, str] = ("#e8f1fb", "#fdf0e2")  # cell tints of sentence A (blue) and B (orange)
    warning: str = "#a34700"  # text that says a figure means little (too few examples, noisy timings)

    def px(self, size: float) -> int:
        """`size` (px on the normal page) in this theme."""
        return max(1, round(size * self.scale))

    def color(self, i: int) -> str:
        """The `i`-th category colour (the palette repeats)."""
        return self.palette[i % len(self.palette)]


NORMAL = Theme("normal")
# Cividis: dark blue to yellow, made for colour-vision deficiency; a washed-out projector loses
# the near-white end of "Blues" (where most attention weights sit), Cividis keeps a dark-to-light ramp.
PROJECTOR = Theme("projector", scale=1.5, full_width=True, sequential="Cividis", labelled_points=8,
                  line_gain=2.6, segment_fill=("#bcd7f2", "#f8cfa5"))  # tints a washed-out image keeps

_current: list[Theme] = [NORMAL]  # the theme in use in this kernel (one dashboard per kernel)


def current() -> Theme:
    """The theme figures are drawn with now."""
    return _current[0]


def use(theme: Theme | bool, page_width: int | None = None) -> Theme:
    """Draw with `theme` from now on (True: projector, False: normal), figures `page_width` px
    wide at most where they fill the tab (None: as before); returns it."""
    chosen = (PROJECTOR if theme else NORMAL) if isinstance(theme, bool) else theme
    width = page_width or _current[0].page_width
    if width != chosen.page_width:
        chosen = replace(chosen, page_width=max(MIN_PAGE_WIDTH, int(width)))
    _current[0] = chosen
    return chosen


def is_projector(theme: Theme | None = None) -> bool:
    return (theme or current()).full_width


def share_tickformat(values: Sequence[float], ticks: int = 8) -> str:
    """A d3 tick format for an axis of shares (0..1) drawn as percents, with enough decimals that ticks
    about max/`ticks` apart read differently (no "0.01 %, 0.01 %"), and no SI prefix ("80μ")."""
    top = max((abs(float(v)) for v in values), default=0.0)
    if top <= 0:
        return ".0%"
    step = top / ticks * 100  # percent between ticks
    return f".{max(0, min(6, -math.floor(math.log10(step))))}%"


# -- figures ------------------------------------------------------------------------------------
_TRACE_FONTS = ("textfont", "insidetextfont", "outsidetextfont")


def finish(fig: go.Figure, theme: Theme | None = None, *, wide: bool = False, markup: bool = False) -> go.Figure:
    """Apply `theme` to a figure built with normal-page sizes (in place; returns it).

    Its data strings (tokens, words, sentences: often typed by a student) are drawn as typed
    (`bertlab.viz.text.plain_figure`), unless `markup`: a builder that writes markup into its data
    itself, and passes every student string through `plain_text`.

    Every font size the figure sets (and the base font the rest inherits), margins, marker
    sizes and table rows are multiplied by `theme.scale`; the height too (up to MAX_HEIGHT).
    In a full-width theme the width is dropped so the figure fills the tab, unless `wide`
    (a figure as wide as its tokens: it keeps its width ×scale, at least the tab's, and its box
    scrolls). The width is always set: plotly's autosize inside a FigureWidget draws 700 px."""
    t = theme or current()
    if not markup:
        plain_figure(fig)
    layout = fig.layout
    if layout.font.size is None:
        layout.font.size = BASE_FONT
    if layout.hoverlabel.font.size is None:
        layout.hoverlabel.font.size = HOVER_FONT
    if t.scale != 1.0:
        k = t.scale
        plain = layout.to_plotly_json()
        plain.pop("template", None)
        sized = _scaled_fonts(plain, k)
        for side in ("l", "r", "t", "b"):
            value = plain.get("margin", {}).get(side)
            if value is not None:
                sized.setdefault("margin", {})[side] = round(value * k)
        if layout.height is not None:
            sized["height"] = round(max(layout.height, min(layout.height * k, MAX_HEIGHT)))
        if layout.width is not None:
            sized["width"] = round(layout.width * k)
        layout.update(sized)
        for trace in fig.data:
            _scale_trace(trace, k)
    if t.full_width:
        layout.width = max(layout.width or 0, t.page_width) if wide else t.page_width
    _room_for_legend(fig)
    return fig


def _room_for_legend(fig: go.Figure) -> None:
    """A horizontal legend above the plot grows a row at a time as the figure narrows, upwards into
    the title. Pin the title to the figure's top edge and hang the legend from just below it
    (container coordinates): plotly then pushes the plot down to make room for every row the legend
    takes, so title, legend and plot never cover each other, however many rows (in place)."""
    layout = fig.layout
    if not (layout.title.text and layout.legend.orientation == "h" and (layout.legend.y or 0) >= 1):
        return
    font = layout.font.size or BASE_FONT
    title_font = layout.title.font.size or round(font * 17 / 12)  # plotly's title: 1.4x the base font
    pad = round(8 * font / BASE_FONT)
    if layout.height is None:
        layout.height = DEFAULT_HEIGHT
    below_title = pad + round(1.5 * title_font) + pad
    layout.title.update(y=1.0, yref="container", yanchor="top", pad=dict(t=pad))
    layout.legend.update(y=1 - below_title / layout.height, yref="container", yanchor="top")


def _scaled_fonts(node: object, k: float, parent: str = "") -> dict:
    """Only the font sizes of a plain layout dict, ×k (same nesting; lists stay lists)."""
    out: dict = {}
    if not isinstance(node, dict):
        return out
    for key, value in node.items():
        if key == "size" and parent.endswith("font") and isinstance(value, (int, float)):
            out[key] = round(value * k, 1)
        elif isinstance(value, dict):
            inner = _scaled_fonts(value, k, key)
            if inner:
                out[key] = inner
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = [_scaled_fonts(v, k) for v in value]
            if any(items):
                out[key] = [{**v, **_deep(v, i)} for v, i in zip(value, items)]
    return out


def _deep(base: dict, sized: dict) -> dict:
    """`base` with `sized` merged in at every depth (for list items, which are assigned whole)."""
    merged = dict(base)
    for key, value in sized.items():
        merged[key] = _deep(base.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def _scale_trace(trace: object, k: float) -> None:
    for name in _TRACE_FONTS:
        font = getattr(trace, name, None)
        if font is not None and font.size is not None and not isinstance(font.size, (tuple, list)):
            font.size = round(font.size * k, 1)
    colorbar = getattr(trace, "colorbar", None)
    if colorbar is not None:
        if colorbar.thickness is not None:
            colorbar.thickness = round(colorbar.thickness * k)
        if colorbar.title.font.size is not None:
            colorbar.title.font.size = round(colorbar.title.font.size * k, 1)
    marker = getattr(trace, "marker", None)
    if marker is not None and getattr(trace, "type", "") == "scatter" and isinstance(marker.size, (int, float)):
        marker.size = round(marker.size * k, 1)
    if getattr(trace, "type", "") == "table":
        for part in (trace.header, trace.cells):
            if part.font.size is not None:
                part.font.size = round(part.font.size * k, 1)
            if part.height is not None:
                part.height = round(part.height * k)
        if trace.columnwidth is not None:
            trace.columnwidth = [round(w * k) for w in trace.columnwidth]


# -- labels --------------------------------------------------------------------------------------
def thin_ticks(labels: Sequence[str], room_px: float, font_px: float,
               gap: float | None = None) -> tuple[list[int], list[str]]:
    """(tick positions, tick labels) for `labels` at positions 0..n-1 along an axis `room_px` long:
    every label when they fit at `gap` × `font_px` apart, else every k-th (others on hover)."""
    n = len(labels)
    if n == 0:
        return [], []
    need = (gap or current().label_gap) * font_px
    step = max(1, math.ceil(n * need / max(room_px, 1.0)))
    keep = list(range(0, n, step))
    return keep, [labels[i] for i in keep]


def matrix_tick_font(n: int) -> int:
    """Tick label size (normal-page px; `finish` scales it) for an n x n matrix of tokens:
    smaller as n grows, never below 10 px (`thin_ticks` drops labels instead)."""
    return 13 if n <= 20 else 11 if n <= 40 else 10


def matrix_ticks(labels: Sequence[str], side: float, theme: Theme | None = None,
                 margins: float = 150) -> tuple[list[int], list[str], int]:
    """(tick positions, tick labels, font size) for a token x token matrix drawn `side` px tall
    on the normal page with `margins` px above and below: every label that fits at the size the
    theme draws it (its height capped at MAX_HEIGHT). The font size is a normal-page size."""
    t = theme or current()
    font = matrix_tick_font(len(labels))
    room = min(side * t.scale, MAX_HEIGHT - margins * t.scale) if t.scale != 1.0 else side
    vals, text = thin_ticks(labels, room, font * t.scale, t.label_gap)
    return vals, text, font


def labelled_points(xy: np.ndarray, n: int, centre: Sequence[float] | None = None,
                    min_gap: float = 0.06, labels: Sequence[str] | None = None,
                    plot_px: tuple[float, float] | None = None, font_px: float = BASE_FONT,
                    equal_axes: bool = True) -> list[int]:
    """Indices of the points of a 2-D map that get their label drawn: the `n` farthest from
    `centre` (default: the mean point; the crowd in the middle stays for hovering), skipping a
    point closer than `min_gap` (a share of the map's extent) to one already chosen, so that
    labels do not sit on each other. `xy`: [point, 2].

    With `labels` and `plot_px` (the plot area's width and height in px; `equal_axes`: one unit is as
    long on both axes) a point is also skipped when its label (drawn `font_px` high, centred above the
    point) would cover a label already chosen: long labels need more room than `min_gap`."""
    pts = np.asarray(xy, dtype=float).reshape(-1, 2)
    if len(pts) == 0 or n <= 0:
        return []
    c = pts.mean(axis=0) if centre is None else np.asarray(centre, dtype=float)
    extent = float(max(np.ptp(pts[:, 0]), np.ptp(pts[:, 1]), 1e-9))
    boxes = None
    if labels is not None and plot_px is not None:
        boxes = _label_boxes(pts, labels, plot_px, font_px, equal_axes)
    order = np.argsort(-np.linalg.norm(pts - c, axis=1), kind="stable")
    chosen: list[int] = []
    for i in order:
        if len(chosen) >= n:
            break
        if any(np.linalg.norm(pts[i] - pts[j]) < min_gap * extent for j in chosen):
            continue
        if boxes is not None and any(_overlap(boxes[i], boxes[j]) for j in chosen):
            continue
        chosen.append(int(i))
    return sorted(chosen)


def _label_boxes(pts: np.ndarray, labels: Sequence[str], plot_px: tuple[float, float],
                 font_px: float, equal_axes: bool = True) -> np.ndarray:
    """[point, 4] (left, top, right, bottom) in px of each point's label, drawn centred above it, on a
    map that fills `plot_px` (plotly pads the data's range ~5 % each side); `equal_axes`: its axes share
    one scale (the smaller)."""
    span = np.maximum(np.ptp(pts, axis=0), 1e-9) * 1.1
    px = np.array(plot_px, dtype=float) / span  # px per data unit, per axis
    if equal_axes:
        px[:] = px.min()
    x, y = pts[:, 0] * px[0], -pts[:, 1] * px[1]  # y grows downwards on the screen
    width = np.array([TEXT_CHAR_EM * font_px * len(str(t)) for t in labels])
    bottom = y - font_px * 0.5  # above the marker
    return np.stack([x - width / 2, bottom - font_px * 1.2, x + width / 2, bottom], axis=1)


def _overlap(a: np.ndarray, b: np.ndarray, pad: float = 2.0) -> bool:
    return bool(a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad)


def plot_area(width: float, height: float, margin: dict, theme: Theme | None = None) -> tuple[float, float]:
    """(width, height) in px of the plot area of a figure built `width` x `height` with `margin` for the
    normal page, as `finish` draws it in `theme` (for `labelled_points`)."""
    t = theme or current()
    k = t.scale
    w = t.page_width if t.full_width else width * k
    h = max(height, min(height * k, MAX_HEIGHT))
    side = {key: margin.get(key, 80) * k for key in ("l", "r", "t", "b")}
    return max(1.0, w - side["l"] - side["r"]), max(1.0, h - side["t"] - side["b"])


def point_text(labels: Sequence[str], keep: Sequence[int]) -> list[str]:
    """Text per point: its label where kept, "" elsewhere (a Scatter's `text` with mode markers+text)."""
    kept = set(keep)
    return [str(label) if i in kept else "" for i, label in enumerate(labels)]


# -- the page ------------------------------------------------------------------------------------
def css(tab_titles: Sequence[str] = ()) -> str:
    """The page's style for both themes (a `<style>` block, shown once by the app).

    Widget text (ipywidgets reads `--jp-widgets-*`), help text, token chips and the attention
    view follow the root's class; figures never clip: a figure wider than its tab scrolls, and
    long rows of tokens wrap. A drop-down is as wide as its longest option (at most its row).
    With `tab_titles` (the app's tabs), the tab bar's titles shrink with the window so that the
    bar stays one row (down to MIN_TAB_FONT px; a window narrower still wraps it)."""
    p = PROJECTOR
    r, pr = f".{ROOT_CLASS}", f".{ROOT_CLASS}.{PROJECTOR_CLASS}"
    return f"""<style>
{r} {{ --bl-line-gain: {NORMAL.line_gain}; }}
{r} .js-plotly-plot {{ flex: 0 0 auto; min-width: max-content; max-width: none; }}
{r} .widget-box:has(> .js-plotly-plot) {{ overflow-x: auto; max-width: 100%; }}
{r} .bertlab-tabs > .lm-TabBar .lm-TabBar-tab {{ flex: 1 1 auto; min-width: max-content; max-width: none; }}
{r} .bertlab-tabs > .lm-TabBar .lm-TabBar-content {{ flex-wrap: wrap; }}
{_tab_bar_css(tab_titles, r, pr)}
{r} .widget-html-content th, {r} .widget-html-content td {{ padding: 2px 8px; }}
{r} .widget-dropdown {{ width: auto !important; max-width: 100%; }}
{r} .widget-dropdown > select {{ flex: 0 1 auto; width: auto; min-width: 6em; }}
{r} .widget-html-content, {r} .widget-label {{ overflow-wrap: anywhere; }}
{r} .widget-toggle-buttons {{ display: flex; flex-wrap: wrap; align-items: center; height: auto; width: auto;
  max-width: 100%; }}
{r} .widget-toggle-buttons > .widget-label {{ flex: 0 0 auto; min-width: var(--jp-widgets-inline-label-width);
  text-align: right; margin-right: 8px; }}
{r} .widget-toggle-buttons > div {{ display: flex; flex-wrap: wrap; flex: 0 1 auto; width: auto; max-width: 100%; }}
{r} .widget-toggle-buttons .widget-toggle-button {{ width: auto; min-width: max-content; }}
{r} .widget-button, {r} .widget-toggle-button {{ min-width: max-content; }}
{r} .widget-hbox {{ flex-wrap: wrap; }}
{r} .widget-hbox > .widget-inline-hbox {{ min-width: 0; }}
{pr} {{
  --bl-line-gain: {p.line_gain};
  --jp-widgets-font-size: {p.px(13)}px;
  --jp-widgets-inline-height: {p.px(28)}px;
  --jp-widgets-inline-label-width: {p.px(80)}px;
  --jp-widgets-inline-width: {p.px(300)}px;
  --jp-widgets-inline-width-short: {p.px(148)}px;
  --jp-widgets-inline-width-tiny: {p.px(72)}px;
  --jp-widgets-slider-handle-size: {p.px(16)}px;
  --jp-ui-font-size1: {p.px(13)}px;
  --jp-content-font-size1: {p.px(14)}px;
  --jp-code-font-size: {p.px(13)}px;
  font-size: {p.px(14)}px;
}}
{pr} .widget-html-content {{ font-size: {p.px(14)}px; line-height: 1.45; }}
{pr} .widget-button, {pr} .widget-toggle-button, {pr} .widget-dropdown select, {pr} .widget-text input,
{pr} .widget-textarea textarea, {pr} .lm-TabBar-tab {{ font-size: {p.px(13)}px; }}
{pr} .lm-TabBar {{ min-height: {p.px(28)}px; }}
{pr} .lm-TabBar-tab {{ min-height: {p.px(26)}px; line-height: {p.px(26)}px; }}
{pr} .widget-text:has(input[type="number"]) {{ width: auto !important; }}
{pr} .bl-attn {{ font-size: {p.px(13)}px; }}
{pr} .bl-attn .bl-chip {{ font-size: {p.px(12)}px; min-width: {p.px(26)}px; height: {p.px(22)}px;
  border-radius: {p.px(11)}px; }}
{pr} .bl-attn .bl-line {{ stroke-width: 3; }}
{pr} .bertlab-note, {pr} .bertlab-busy {{ font-size: {p.px(14)}px; }}
{pr} [style*="color:#555"], {pr} [style*="color:#666"], {pr} [style*="color:#777"] {{ color: #222 !important; }}
body:has({pr}) .jp-MarkdownCell {{ display: none; }}
</style>"""


def _tab_bar_css(titles: Sequence[str], r: str, pr: str) -> str:
    """Tab titles sized to the window: the largest font (up to the theme's) at which every title, with
    its padding, fits one row of a bar about 100vw - 50px wide."""
    if not titles:
        return ""
    pad = "clamp(4px, 0.6vw, 10px)"  # each side of a title
    room = f"(100vw - 50px - {len(titles)} * (2 * {pad} + 1px))"
    em = TAB_CHAR_EM * sum(len(t) for t in titles)  # the row's width in em of the font
    size = f"calc({room} / {em:.1f})"
    tab = ".bertlab-tabs > .lm-TabBar .lm-TabBar-tab"
    return (f"{r} {tab} {{ padding: 0 {pad}; font-size: clamp({MIN_TAB_FONT}px, {size}, {NORMAL.px(13)}px); }}\n"
            f"{pr} {tab} {{ font-size: clamp({MIN_TAB_FONT}px, {size}, {PROJECTOR.px(13)}px); }}")


def help_html(text: str, tag: str = "div", extra: str = "") -> str:
    """A help line or a setting's note in the page's one style; `text` is HTML (escape student text
    first), `extra` more CSS (";max-width:760px")."""
    return f'<{tag} style="{HELP_STYLE}{extra}">{text}</{tag}>'


def note_html(level: str, text: str) -> str:
    """A message line's note: plain `text` (escaped here) in the style of its level (info, warning, error)."""
    return (
        f'<div class="bertlab-note bertlab-{level}" style="{NOTE_STYLE[level]};'
        f'padding:4px 10px;margin:3px 0;border-radius:3px;line-height:1.4">{html.escape(text)}</div>'
    )


# -- the busy sign (panels' message lines) ----------------------------------------------------------
_SPIN = "bertlab-spin"


def busy_html(text: str = "Working…") -> str:
    """A spinner (CSS only: no icon font, nothing fetched) and `text`, for anything that takes a while."""
    return (
        f"<style>@keyframes {_SPIN}{{to{{transform:rotate(360deg)}}}}</style>"
        f'<div class="bertlab-busy" style="color:{BUSY_COLOUR};padding:4px 10px;margin:3px 0">'
        f'<span style="display:inline-block;width:0.9em;height:0.9em;margin-right:0.5em;vertical-align:-0.1em;'
        f"border:2px solid {NOTE_EDGE['info']};border-right-color:transparent;border-radius:50%;"
        f'animation:{_SPIN} 0.8s linear infinite"></span>{html.escape(text)}</div>'
    )
