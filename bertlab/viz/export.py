"""Figures and attention views as files a student can keep: PNG, SVG or offline HTML.

PNG and SVG come from plotly's static export (kaleido >= 1, which drives a headless
Chrome/Chromium); nothing is fetched from the network: plotly.js is read from the plotly
package and MathJax is left out. HTML pages embed plotly.js, so they open offline too.

    data = export_figure(fig, "png")              # bytes; ExportUnavailable without kaleido/Chrome
    html = download_link(data, "mask-top-k.png")  # <a download=...> for an ipywidgets.HTML
    path = save_export(data, "bertlab-exports", "mask-top-k.png")
"""

from __future__ import annotations

import base64
import html
import importlib.metadata
import io
import logging
import re
import unicodedata
import zipfile
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar, Literal

import plotly
import plotly.graph_objects as go
import plotly.io as pio

log = logging.getLogger(__name__)

Format = Literal["png", "svg", "html"]
FORMATS: tuple[Format, ...] = ("png", "svg", "html")
STATIC_FORMATS: frozenset[str] = frozenset({"png", "svg"})
MIME: dict[str, str] = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html"}
DEFAULT_SIZE = (700, 500)  # layout pixels for a figure that sets no width/height (plotly's default)
PNG_SCALE = 2  # pixels per layout pixel: sharp on slides and high-DPI screens
DEFAULT_FOLDER = "bertlab-exports"
_PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class ExportUnavailable(RuntimeError):
    """PNG/SVG cannot be made here (kaleido or a Chrome-type browser is missing); HTML still can."""


# -- what this machine can do ------------------------------------------------------------------
def static_export_problem() -> str | None:
    """Why PNG/SVG export cannot work here, in words for the student; None when it should."""
    try:
        version = importlib.metadata.version("kaleido")
    except importlib.metadata.PackageNotFoundError:
        return "PNG and SVG need the kaleido package (pip install 'kaleido>=1'), which is not installed."
    if int(version.split(".")[0]) < 1:
        return f"PNG and SVG need kaleido 1.0 or newer; kaleido {version} is installed (pip install -U 'kaleido>=1')."
    if _browser_path() is None:
        return ("PNG and SVG need Chrome or Chromium (kaleido drives it to draw the image), and none was found; "
                "install one (e.g. apt-get install chromium) or set BROWSER_PATH to it.")
    return None


def _browser_path() -> str | None:
    """The Chrome/Chromium kaleido would start (it honours BROWSER_PATH), or None."""
    try:
        from choreographer.browsers.chromium import Chromium

        return Chromium.find_browser(skip_local=False)
    except Exception:  # choreographer changed its API: let the export itself find out
        log.debug("could not ask choreographer for a browser", exc_info=True)
        return "unknown"


# -- making the bytes --------------------------------------------------------------------------
def figure_html(fig: go.Figure, title: str = "bertlab figure") -> str:
    """The figure as one HTML page with plotly.js embedded (no CDN): opens offline, stays interactive."""
    page = pio.to_html(go.Figure(fig), include_plotlyjs=True, include_mathjax=False, full_html=True,
                       config={"displaylogo": False})
    return page.replace("<head>", f"<head><title>{html.escape(title)}</title>", 1)


def figure_image(fig: go.Figure, fmt: Literal["png", "svg"], scale: float = PNG_SCALE) -> bytes:
    """The figure as PNG or SVG bytes via kaleido (a headless browser start: a few seconds).

    Raises ExportUnavailable, with a message that offers HTML, when kaleido or the browser
    is missing or fails to start.
    """
    if fmt not in STATIC_FORMATS:
        raise ValueError(f"figure_image makes png or svg, not {fmt!r}.")
    problem = static_export_problem()
    if problem:
        raise ExportUnavailable(f"{problem} HTML export still works (and keeps the figure interactive).")
    import kaleido

    spec = go.Figure(fig).to_dict()
    layout = spec.get("layout", {})
    opts = {
        "format": fmt,
        "width": layout.get("width") or DEFAULT_SIZE[0],
        "height": layout.get("height") or DEFAULT_SIZE[1],
        "scale": scale if fmt == "png" else 1,
    }
    try:
        # plotly.js from the plotly package and no MathJax: nothing is asked of the network
        data = kaleido.calc_fig_sync(spec, opts=opts, kopts={"plotlyjs": str(_PLOTLY_JS), "mathjax": False})
    except Exception as e:  # the browser would not start or crashed: report, do not crash the tab
        log.exception("static export (%s) failed", fmt)
        raise ExportUnavailable(
            f"Making the {fmt.upper()} failed ({type(e).__name__}: {e}). HTML export still works."
        ) from e
    return data if isinstance(data, bytes) else str(data).encode("utf-8")


def export_figure(fig: go.Figure, fmt: Format, title: str = "bertlab figure") -> bytes:
    """The figure in `fmt` ("png", "svg" or "html") as the bytes of the file."""
    if fmt == "html":
        return figure_html(fig, title).encode("utf-8")
    if fmt in STATIC_FORMATS:
        return figure_image(fig, fmt)
    raise ValueError(f"Unknown format {fmt!r}: pick one of {', '.join(FORMATS)}.")


# -- naming, linking, saving -------------------------------------------------------------------
def file_name(name: str, fmt: str, limit: int = 60) -> str:
    """A safe file name from a figure name: "Mask: top-k" -> "mask-top-k.png"."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")
    if len(slug) > limit:  # cut at a word boundary when there is one
        slug = slug[: limit + 1].rsplit("-", 1)[0] if "-" in slug[: limit + 1] else slug[:limit]
    return f"{slug or 'figure'}.{fmt}"


def stamped(filename: str, when: datetime) -> str:
    """`filename` with the time it was made: "mask-top-k.png" -> "mask-top-k_2026-11-24_091205.png",
    for a file whose plain name is taken (a repeated export keeps a name that says what it is)."""
    path = Path(filename)
    return f"{path.stem}_{when:%Y-%m-%d_%H%M%S}{path.suffix}"


def download_link(data: bytes, filename: str, label: str | None = None) -> str:
    """An `<a download>` whose href carries the file as a data: URL (no server round trip)."""
    mime = MIME.get(Path(filename).suffix.lstrip("."), "application/octet-stream")
    b64 = base64.b64encode(data).decode("ascii")
    label = label or f"Download {filename} ({_size(len(data))})"
    return (f'<a download="{html.escape(filename)}" href="data:{mime};base64,{b64}" '
            f'style="font-weight:600">{html.escape(label)}</a>')


def zip_folder(folder: Path) -> bytes:
    """The files of `folder` (and its sub-folders) as a zip, named relative to the folder's parent."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(folder.parent))
    return buf.getvalue()


def save_export(data: bytes, folder: str | Path, filename: str) -> Path:
    """Write `data` to `folder/filename` (folder made if needed); never overwrites: adds -2, -3, ...
    Each name is claimed with an exclusive create, so two exports at once never share a file."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(filename).name  # a file name, never a path into another folder
    stem, suffix, n = Path(name).stem, Path(name).suffix, 1
    while True:
        path = folder / (name if n == 1 else f"{stem}-{n}{suffix}")
        try:
            f = path.open("xb")
        except FileExistsError:
            n += 1
            continue
        try:
            with f:
                f.write(data)
        except OSError:  # disk full: leave no half-written file behind
            path.unlink(missing_ok=True)
            raise
        return path.resolve()


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{max(1, round(n / 1024))} kB"


# -- checking a page works offline ------------------------------------------------------------
class _Resources(HTMLParser):
    """Collects what a page would load: src/href of script, link, img, iframe... and CSS url()/@import."""

    LOADS: ClassVar[dict[str, str]] = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src",
             "embed": "src", "object": "data", "audio": "src", "video": "src"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = self.LOADS.get(tag)
        self.urls += [v for k, v in attrs if k == wanted and v]
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += re.findall(r"""(?:url\(\s*|@import\s+)["']?([^"')\s;]+)""", data)


def remote_resources(page: str) -> list[str]:
    """The http(s):// or //host URLs a page would load (scripts, styles, images); [] = opens offline."""
    parser = _Resources()
    parser.feed(page)
    parser.close()
    return [u for u in parser.urls if re.match(r"^\s*(https?:)?//", u, re.IGNORECASE)]
