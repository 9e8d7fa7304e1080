"""Projector mode without a browser: the theme's sizes reach the figures, labels a projector needs
are drawn (not hover-only), big matrices thin their axis labels, and the setting reaches the app
from the toggle, the page's address and `bertlab serve --projector`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlab import cli
from bertlab.analysis.attention import AttentionResult
from bertlab.analysis.similarity import TokenSimilarity, WordProjection
from bertlab.panels.app import App, projector_in_query, projector_requested
from bertlab.panels.state import ModelState
from bertlab.settings import projector
from bertlab.viz import theme
from bertlab.viz.attention import plot_attention_heatmap
from bertlab.viz.similarity import plot_token_similarity, plot_word_projection
from bertlab.viz.theme import NORMAL, OKABE_ITO, PROJECTOR, finish, labelled_points, thin_ticks

ATTENTION = ("Attention", "bertlab.panels.attention:AttentionPanel")
INPUT = ("Input", "bertlab.panels.representation:RepresentationPanel")


@pytest.fixture(autouse=True)
def normal_theme():
    """Every test starts and ends on the normal page (the theme in use is per kernel)."""
    theme.use(NORMAL)
    yield
    theme.use(NORMAL)


def _attention(n: int) -> AttentionResult:
    gen = torch.Generator().manual_seed(0)
    attn = torch.rand(2, 2, n, n, generator=gen).softmax(-1)  # [layer, head, query, key]
    return AttentionResult(tokens=[f"tok{i}" for i in range(n)], sentence_b_start=None, patterns=attn)


def _similarity(n: int) -> TokenSimilarity:
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(2, n, 8, generator=gen)  # [stage, token, hidden]
    unit = vectors / vectors.norm(dim=-1, keepdim=True)
    return TokenSimilarity(tokens=[f"w{i}" for i in range(n)], matrices=unit @ unit.transpose(1, 2),
                           stage_names=["embeddings", "layer 0"])


# -- sizes ---------------------------------------------------------------------------------------
def test_projector_scales_every_font_and_the_height_and_fills_the_tab():
    result = _attention(16)
    normal = plot_attention_heatmap(result, 0, 0, style=NORMAL)
    big = plot_attention_heatmap(result, 0, 0, style=PROJECTOR)
    assert big.layout.font.size == 1.5 * normal.layout.font.size >= 18
    assert big.layout.title.font.size == 1.5 * normal.layout.title.font.size
    assert big.layout.xaxis.tickfont.size == 1.5 * normal.layout.xaxis.tickfont.size
    assert big.layout.hoverlabel.font.size == 1.5 * normal.layout.hoverlabel.font.size
    assert big.data[0].colorbar.thickness == 1.5 * normal.data[0].colorbar.thickness
    assert big.layout.margin.l == 1.5 * normal.layout.margin.l
    assert big.layout.height == min(1.5 * normal.layout.height, theme.MAX_HEIGHT)
    assert big.layout.width == PROJECTOR.page_width  # the tab's width, not the normal fixed width
    assert normal.layout.width != PROJECTOR.page_width


def test_the_theme_in_use_draws_and_the_page_width_is_the_one_reported():
    theme.use(True, page_width=1234)
    fig = plot_attention_heatmap(_attention(8), 0, 0)
    assert fig.layout.width == 1234 and fig.layout.font.size == 18
    assert fig.data[0].colorscale != plot_attention_heatmap(_attention(8), 0, 0, style=NORMAL).data[0].colorscale
    theme.use(False)
    assert plot_attention_heatmap(_attention(8), 0, 0).layout.font.size == 12


def test_a_figure_as_wide_as_its_tokens_keeps_its_width_and_is_at_least_the_tab():
    import plotly.graph_objects as go

    wide = finish(go.Figure(layout=dict(width=1400, height=200)), PROJECTOR, wide=True)
    narrow = finish(go.Figure(layout=dict(width=300, height=200)), PROJECTOR, wide=True)
    assert wide.layout.width == 2100 and narrow.layout.width == PROJECTOR.page_width


def test_trace_and_table_fonts_scale():
    from bertlab.analysis.mask import WordScore
    from bertlab.viz.mask import plot_word_predictability

    scores = [WordScore(i, w, [w], [0.5], [1], ["x"], -0.7) for i, w in enumerate(("a", "b"))]
    normal = plot_word_predictability(scores, style=NORMAL)
    big = plot_word_predictability(scores, style=PROJECTOR)
    assert big.data[0].textfont.size == 1.5 * normal.data[0].textfont.size


# -- labels --------------------------------------------------------------------------------------
def test_thin_ticks_keeps_every_label_that_fits_and_spaces_the_rest():
    labels = [str(i) for i in range(128)]
    vals, text = thin_ticks(labels, room_px=760, font_px=10, gap=1.5)
    assert 10 < len(vals) < 128 and text == [labels[i] for i in vals]
    assert 760 / len(vals) >= 1.5 * 10  # room per label
    assert thin_ticks(labels[:16], 760, 10, 1.5)[0] == list(range(16))


@pytest.mark.parametrize("style", [NORMAL, PROJECTOR])
def test_a_128_token_matrix_draws_labels_that_do_not_overlap(style):
    fig = plot_token_similarity(_similarity(128), 1, style=style)
    shown = len(fig.layout.yaxis.ticktext)
    assert 10 < shown < 128
    font = fig.layout.yaxis.tickfont.size
    plot_height = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_height / shown >= 1.4 * font  # each label has room for itself
    assert fig.data[0].customdata[5][7][0] == "w5"  # hover still names every token


def test_attention_heatmap_on_128_tokens_thins_its_labels():
    fig = plot_attention_heatmap(_attention(128), 0, 0, style=PROJECTOR)
    assert len(fig.layout.xaxis.tickvals) < 64 and fig.layout.xaxis.ticktext[0] == "tok0"


def test_labelled_points_are_the_farthest_and_apart():
    xy = np.array([[0, 0], [0.1, 0], [10, 0], [9.9, 0.05], [0, -5], [-3, 0]], dtype=float)
    chosen = labelled_points(xy, 3, centre=(0, 0))
    assert chosen == [2, 4, 5]  # 3 (next to 2) is skipped: its label would sit on 2's
    assert labelled_points(xy, 0) == [] and labelled_points(np.zeros((0, 2)), 3) == []


def test_a_word_map_draws_labels_on_its_outermost_points():
    gen = torch.Generator().manual_seed(1)
    words = ["bank"] * 10 + ["river"] * 10
    proj = WordProjection(words=words, sentence_index=list(range(20)), sentences=[f"s{i}" for i in range(20)],
                          spans=[(1, 2)] * 20, vectors=torch.zeros(1, 20, 4),
                          points=torch.randn(1, 20, 2, generator=gen), explained=torch.tensor([[0.5, 0.2]]),
                          stage_names=["embeddings"])
    fig = plot_word_projection(proj, 0, style=PROJECTOR)
    drawn = [t for trace in fig.data for t in trace.text if t]
    assert len(drawn) == PROJECTOR.labelled_points and all(t.split(" (")[0] in ("bank", "river") for t in drawn)
    assert "text" in fig.data[0].mode


def test_colours_are_colour_blind_safe():
    from bertlab.viz.representation import PART_COLORS

    assert PART_COLORS["token"] in OKABE_ITO and PART_COLORS["segment"] in OKABE_ITO
    assert PROJECTOR.sequential != "Blues"  # its near-white end vanishes on a washed-out projector
    assert PROJECTOR.line_gain > NORMAL.line_gain


# -- the setting -----------------------------------------------------------------------------------
def test_the_page_address_and_serve_option_ask_for_projector_mode():
    assert projector_in_query("?projector=1") is True and projector_in_query("token=a&projector") is True
    assert projector_in_query("projector=0") is False and projector_in_query("token=a") is None
    assert projector({"BERTLAB_PROJECTOR": "1"}) and not projector({})
    assert projector_requested({"QUERY_STRING": "projector=1"})
    assert not projector_requested({"BERTLAB_PROJECTOR": "1", "QUERY_STRING": "projector=off"})  # the page wins
    args = cli.build_parser().parse_args(["serve", "--projector", "--no-browser"])
    _, env = cli.serve_command(args, env={})
    assert env["BERTLAB_PROJECTOR"] == "1"
    _, env = cli.serve_command(cli.build_parser().parse_args(["serve", "--no-browser"]), env={})
    assert "BERTLAB_PROJECTOR" not in env


def test_the_toggle_and_the_address_switch_the_app(default_model):
    app = App(ModelState(*default_model), tabs=(ATTENTION, INPUT), first=0)
    figure = app.panels["Attention"].figure
    assert figure.layout.font.size == 12 and theme.PROJECTOR_CLASS not in app.widget._dom_classes
    app.page.width = 900
    app.projector.value = True  # the teacher clicks the toggle
    assert theme.PROJECTOR_CLASS in app.widget._dom_classes and theme.ROOT_CLASS in app.widget._dom_classes
    assert figure.layout.font.size == 18 and figure.layout.width == 900  # the tab on show redrew
    app.tabs.selected_index = 1  # a tab built now draws large too
    assert app.panels["Input"].projection.layout.font.size == 18
    app.page.query = "?projector=0"  # the page's address says otherwise
    assert app.projector.value is False and theme.PROJECTOR_CLASS not in app.widget._dom_classes
    assert app.panels["Input"].projection.layout.font.size == 12
    app.tabs.selected_index = 0  # a tab drawn before the switch redraws when next opened
    assert figure.layout.font.size == 12 and figure.layout.width != 900


def test_labelled_points_skip_a_label_that_would_cover_another():
    # two points 1 unit apart on a 10-unit map drawn 500 px wide: 50 px apart, closer than their long labels
    xy = np.array([[0, 0], [10, 0], [9, 0], [0, 10]], dtype=float)
    short = labelled_points(xy, 4, centre=(5, 5), min_gap=0.0, labels=["a", "b", "c", "d"], plot_px=(500, 500))
    long = labelled_points(xy, 4, centre=(5, 5), min_gap=0.0, labels=["a", "river bank", "money bank", "d"],
                           plot_px=(500, 500))
    assert short == [0, 1, 2, 3] and long == [0, 1, 3]  # 1 is farther from the centre, so it keeps its label
    assert labelled_points(xy, 4, centre=(5, 5), min_gap=0.0, labels=["a", "river bank", "money bank", "d"],
                           plot_px=(5000, 5000)) == [0, 1, 2, 3]  # drawn ten times larger, both fit


def test_the_tab_bar_css_sizes_titles_to_the_window():
    from bertlab.viz.theme import MIN_TAB_FONT, TAB_CHAR_EM, css

    titles = ["Input", "Mask", "Next sentence"]
    page = css(titles)
    assert f"clamp({MIN_TAB_FONT}px, calc((100vw - 50px - 3 * (" in page
    assert f"/ {TAB_CHAR_EM * 22:.1f})" in page  # 22 characters in all
    assert f"{PROJECTOR.px(13)}px); }}" in page  # projector mode may grow them further
    assert "calc((100vw" not in css()  # a page without tabs (the teacher's view) keeps its titles


def test_a_legend_above_the_plot_hangs_below_the_title_whatever_its_rows():
    """A horizontal legend above the plot wraps as the figure narrows; hung from just below the
    title in container coordinates, plotly pushes the plot down for each row (the browser check of
    the same: tests/browser/test_layout.py, no legend entry on a figure's title)."""
    import plotly.graph_objects as go

    def figure(style) -> go.Figure:
        fig = go.Figure([go.Bar(name=f"a rather long legend entry {i}", x=[0], y=[i]) for i in range(5)])
        fig.update_layout(title=dict(text="A title", font=dict(size=14)), width=500, height=400,
                          legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
                          margin=dict(l=60, r=20, t=40, b=60))
        return finish(fig, style)

    for style in (NORMAL, PROJECTOR):
        fig = figure(style)
        layout = fig.layout
        assert (layout.title.yref, layout.title.y, layout.title.yanchor) == ("container", 1.0, "top")
        assert (layout.legend.yref, layout.legend.yanchor) == ("container", "top")
        title_bottom = layout.title.pad.t + 1.4 * layout.title.font.size  # px from the top, plotly's line height
        assert (1 - layout.legend.y) * layout.height > title_bottom
    untitled = go.Figure([go.Bar(name="x", x=[0], y=[1]), go.Bar(name="y", x=[0], y=[2])])
    untitled.update_layout(legend=dict(orientation="h", y=1.02), margin=dict(t=30))
    assert finish(untitled, NORMAL).layout.legend.yref is None  # no title: nothing to keep apart
