"""Export of figures as files: offline HTML, PNG/SVG through kaleido (and its absence), links, saving."""

from __future__ import annotations

import base64
import re
import struct

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from bertlab.viz import export
from bertlab.viz.export import (
    ExportUnavailable,
    download_link,
    export_figure,
    figure_html,
    figure_image,
    file_name,
    remote_resources,
    save_export,
    static_export_problem,
)

needs_static = pytest.mark.skipif(static_export_problem() is not None, reason=str(static_export_problem()))


@pytest.fixture
def fig() -> go.Figure:
    return go.Figure(go.Bar(x=["paris", "london"], y=[0.625, 0.125]), layout={"width": 400, "height": 300})


# -- HTML ---------------------------------------------------------------------------------------
def test_html_embeds_plotly_js_and_the_data_and_loads_nothing_remote(fig):
    page = figure_html(go.FigureWidget(fig), title="Mask: <top-k>")
    assert remote_resources(page) == []
    assert len(page) > 1_000_000  # plotly.min.js is inline, not fetched from the CDN
    assert "<title>Mask: &lt;top-k&gt;</title>" in page
    assert '"paris","london"' in page and "0.625" in page
    assert export_figure(fig, "html", title="x").decode("utf-8").startswith("<!doctype html>")


def test_remote_resources_finds_what_a_page_would_fetch():
    cdn_page = pio.to_html(go.Figure(), include_plotlyjs="cdn", full_html=True)
    assert any(u.startswith("https://cdn.plot.ly/") for u in remote_resources(cdn_page))
    page = (
        '<html><head><link rel="stylesheet" href="//fonts.example.org/a.css">'
        "<style>@import 'http://x.org/b.css'; div { background: url(https://x.org/c.png) }</style>"
        '<script src="local.js"></script>'
        '<script>const NS = "http://www.w3.org/2000/svg"; const s = \'<script src="https://no.org/x.js">\';</script>'
        '</head><body><img src="data:image/png;base64,AAAA"><a href="https://fine.org">a link loads nothing</a>'
        "</body></html>"
    )
    assert remote_resources(page) == ["//fonts.example.org/a.css", "http://x.org/b.css", "https://x.org/c.png"]


# -- PNG / SVG ---------------------------------------------------------------------------------
@needs_static
def test_png_is_a_real_png_at_twice_the_layout_size(fig):
    data = export_figure(fig, "png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (800, 600)


@needs_static
def test_svg_is_an_svg_document_with_the_bars(fig):
    text = export_figure(fig, "svg").decode("utf-8")
    assert re.match(r"\s*(<\?xml[^>]*>\s*)?<svg\b", text)
    assert 'width="400"' in text and 'height="300"' in text
    assert text.count('class="point"') == 2  # one path per bar


def test_missing_kaleido_says_so_and_offers_html(fig, monkeypatch):
    def not_installed(name):
        raise export.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(export.importlib.metadata, "version", not_installed)
    assert "kaleido" in static_export_problem()
    with pytest.raises(ExportUnavailable, match=r"kaleido.*HTML export still works"):
        figure_image(fig, "png")


def test_old_kaleido_and_missing_browser_are_explained(fig, monkeypatch):
    monkeypatch.setattr(export.importlib.metadata, "version", lambda name: "0.2.1")
    assert "kaleido 1.0 or newer" in static_export_problem()
    monkeypatch.undo()
    monkeypatch.setattr(export, "_browser_path", lambda: None)
    assert "Chrome or Chromium" in static_export_problem()
    with pytest.raises(ExportUnavailable, match="Chromium.*HTML"):
        export_figure(fig, "svg")


def test_a_browser_that_fails_to_start_becomes_export_unavailable(fig, monkeypatch):
    kaleido = pytest.importorskip("kaleido")
    monkeypatch.setattr(export, "static_export_problem", lambda: None)

    def crash(*args, **kwargs):
        raise RuntimeError("Chromium exited with code 1")

    monkeypatch.setattr(kaleido, "calc_fig_sync", crash)
    with pytest.raises(ExportUnavailable, match="Making the PNG failed.*exited with code 1.*HTML"):
        figure_image(fig, "png")


def test_unknown_formats_are_refused(fig):
    with pytest.raises(ValueError, match="pick one of png, svg, html"):
        export_figure(fig, "jpg")
    with pytest.raises(ValueError, match="png or svg"):
        figure_image(fig, "html")


# -- names, links, files -----------------------------------------------------------------------
@pytest.mark.parametrize(("name", "expected"), [
    ("Mask: top-k", "mask-top-k.png"),
    ("Attention: layer 3 / head 5", "attention-layer-3-head-5.png"),
    ("Café — 東京 ✨", "cafe.png"),
    ("東京", "figure.png"),
    ("../../etc/passwd", "etc-passwd.png"),
])
def test_file_names_are_safe_slugs(name, expected):
    assert file_name(name, "png") == expected


def test_file_names_are_cut_to_the_limit():
    assert file_name("a b " * 100, "svg", limit=20) == "a-b-a-b-a-b-a-b-a-b.svg"
    assert file_name("the animal didn't cross", "html", limit=16) == "the-animal-didn.html"
    assert file_name("x" * 100, "png", limit=10) == "xxxxxxxxxx.png"


def test_download_link_carries_the_bytes_as_a_data_url():
    data = bytes(range(256)) * 10
    link = download_link(data, 'odd "name".png')
    m = re.fullmatch(r'<a download="([^"]*)" href="data:([^;]+);base64,([^"]+)"[^>]*>Download (.*) \((.*)\)</a>', link)
    assert m, link
    assert m.group(1) == "odd &quot;name&quot;.png" and m.group(2) == "image/png"
    assert base64.b64decode(m.group(3)) == data
    assert m.group(5) == "2 kB"
    assert 'href="data:image/svg+xml;base64,' in download_link(b"<svg/>", "a.svg")
    assert 'href="data:text/html;base64,' in download_link(b"<html/>", "a.html")


def test_save_export_makes_the_folder_and_never_overwrites(tmp_path):
    folder = tmp_path / "new" / "exports"
    first = save_export(b"one", folder, "mask.png")
    second = save_export(b"two", folder, "mask.png")
    third = save_export(b"three", folder, "mask.png")
    assert (first.name, second.name, third.name) == ("mask.png", "mask-2.png", "mask-3.png")
    assert first.read_bytes() == b"one" and third.read_bytes() == b"three"
    assert first.is_absolute()
