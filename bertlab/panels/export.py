"""Export tab: any figure on show as PNG, SVG or offline HTML; attention views as offline pages."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attention import AttentionResult, attention_patterns
from bertlab.inputs import InputError, os_error_message
from bertlab.panels.base import Level, Panel, input_notes, sentence_pair
from bertlab.panels.record import session_header, session_sections
from bertlab.tokenizer import Tokenizer
from bertlab.viz.attention_view import attention_page
from bertlab.viz.export import (
    DEFAULT_FOLDER,
    ExportUnavailable,
    download_link,
    export_figure,
    file_name,
    save_export,
    stamped,
    static_export_problem,
)
from bertlab.viz.record import RecordSection, lab_record_html
from bertlab.viz.theme import help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired."
MAX_TOKENS = 128  # the offline page stays well under 2 MB of attention data
HELP = (
    "Pick a figure from the tabs you opened (press Refresh after drawing something new), a format, "
    "then Export: the link downloads the file, and a copy goes to the folder. HTML pages stay "
    "interactive and open offline. The attention view export makes one page with the head view "
    "and model view of a sentence (pair)."
)
CLASS_HELP = HELP.replace(" the link downloads the file, and a copy goes to the folder.",
                          " the link downloads the file to your computer.")
RECORD_HELP = (
    "A lab record is one HTML page of this session to hand in: the model, the seeds, and each tab you opened "
    "with what you typed, its figures (interactive) and attention views. It opens offline in any browser."
)
FigureSource = Callable[[], dict[str, go.Figure]]
SessionSource = Callable[[], tuple[str, Mapping[str, Panel]]]  # (the model's name, the opened tabs)


class ExportPanel(Panel):
    """Turns the figures of the other tabs, and attention views, into files."""

    title = "Export"
    teaches = ("Keep what you found: any figure as PNG, SVG or interactive HTML, and attention views "
               "as pages that open offline.")

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Tokenizer,
        figures: FigureSource | None = None,
        folder: str | Path | None = None,
        text: str = DEFAULT_TEXT,
        max_length: int = MAX_TOKENS,
        workspace: Workspace | None = None,
        session: SessionSource | None = None,
    ) -> None:
        """`folder`: where copies of the files go (default: DEFAULT_FOLDER; in class mode the session's
        workspace, and the tab shows no folder field: files reach the student as downloads only).
        `session`: the picked model's name and the opened tabs, for the lab record (the app gives it;
        without it the record holds the model and the figures of `figures`)."""
        super().__init__()
        self.model, self.tok, self.source, self.max_length = model, tok, figures, max_length
        self.session = session
        self.workspace = workspace or Workspace.for_session()
        self.clock: Callable[[], datetime] = datetime.now  # the time a repeated name gets
        self._given: set[str] = set()  # the names of the downloads offered so far
        self._folder = Path(folder) if folder is not None else None
        wide = widgets.Layout(width="min(100%, 720px)")
        self.choice = widgets.Dropdown(options=[], description="Figure", layout=wide)
        self.refresh_button = widgets.Button(description="Refresh", tooltip="List the figures on show now")
        self.format = widgets.ToggleButtons(
            options=[("PNG", "png"), ("SVG", "svg"), ("HTML", "html")], value="png", description="Format",
            tooltips=["Picture for slides (a few seconds)", "Vector picture", "Interactive page, opens offline"],
        )
        self.export_button = widgets.Button(description="Export", button_style="primary",
                                            tooltip="Make the file and a download link")
        self.text_a, self.text_b = sentence_pair(text, placeholder_a="")
        self.view_button = widgets.Button(description="Export attention view", button_style="primary",
                                          layout=widgets.Layout(width="auto"))
        self.folder = widgets.Text(value=str(folder if folder is not None else DEFAULT_FOLDER), description="Folder",
                                   layout=wide)
        self.student = widgets.Text(value="", description="Your name", placeholder="optional: printed on the record",
                                    layout=widgets.Layout(width="min(100%, 420px)"))
        self.record_button = widgets.Button(description="Make lab record", button_style="primary",
                                            layout=widgets.Layout(width="auto"),
                                            tooltip="One HTML page of this session's tabs: inputs, figures, attention")
        self.link = widgets.HTML(value="")
        classroom = self.workspace.confined
        self.help = widgets.HTML(help_html(CLASS_HELP if classroom else HELP))
        self.refresh_button.on_click(self._on_refresh)
        self.export_button.on_click(self._on_export)
        self.view_button.on_click(self._on_export_view)
        self.record_button.on_click(self._on_record)
        self._widget = widgets.VBox(
            [
                self.help,
                widgets.HTML("<b>Figures</b>"),
                widgets.HBox([self.choice, self.refresh_button]),
                widgets.HBox([self.format, self.export_button]),
                widgets.HTML("<b>Attention view</b>"),
                self.text_a,
                widgets.HBox([self.text_b, self.view_button]),
                widgets.HTML("<b>Lab record</b>"),
                widgets.HTML(help_html(RECORD_HELP)),
                widgets.HBox([self.student, self.record_button]),
                *([] if classroom else [self.folder]),  # class mode: no server folder, downloads only
                self.message,
                self.link,
            ],
            layout=widgets.Layout(width="100%"),
        )
        self._on_refresh()

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Attention views are made with the new model from now on; the figure list follows the tabs."""
        self.model, self.tok = model, tok
        with self.reporting():
            self._list_figures()

    def figures(self) -> dict[str, go.Figure]:
        return {}

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def refresh(self) -> None:
        """List the figures the other tabs show now (the app calls this when the tab opens)."""
        self.show_messages(self._list_figures())

    def _on_refresh(self, _=None) -> None:
        with self.reporting():
            self.refresh()

    def _on_export(self, _=None) -> None:
        fmt = self.format.value
        text = "Making the HTML…" if fmt == "html" else \
            f"Making the {fmt.upper()} (a headless browser starts: a few seconds)…"
        with self.busy(self.export_button, text=text), self.reporting():
            self.link.value = ""
            name = self.choice.value
            if not name:
                raise InputError("There is no figure to export yet: open a tab that draws one, then press Refresh.")
            fig = self._current().get(name)
            if fig is None:
                raise InputError(f"The figure {name!r} is no longer on show: press Refresh and pick again.")
            notes: list[tuple[Level, str]] = []
            try:
                data = export_figure(fig, fmt, title=name)
            except ExportUnavailable as e:
                notes.append(("warning", f"{e} Here is the HTML."))
                fmt, data = "html", export_figure(fig, "html", title=name)
            self.show_messages(notes + self._deliver(data, file_name(name, fmt)))

    def _on_export_view(self, _=None) -> None:
        with self.busy(self.view_button, text="Making the attention view's page…"), self.reporting():
            self.link.value = ""
            result = self._attention()
            _, page = attention_page(result)
            saved = self._deliver(page.encode("utf-8"), file_name(f"attention {self.text_a.value}", "html", limit=40))
            self.show_messages(saved + _view_notes(result))

    def _on_record(self, _=None) -> None:
        with self.busy(self.record_button, text="Making the lab record…"), self.reporting():
            self.link.value = ""
            page, tabs = self.lab_record()
            name = file_name(f"lab record {self.student.value.strip()}".strip(), "html", limit=40)
            saved = self._deliver(page.encode("utf-8"), name)
            what = (f"The record holds {tabs} tab(s)." if tabs else
                    "No tab has drawn anything yet: the record holds only the model. Open a tab first.")
            self.show_messages(saved + [("info" if tabs else "warning", what)])

    def lab_record(self) -> tuple[str, int]:
        """The lab record page of this session, and how many tabs it holds."""
        if self.session is not None:
            name, panels = self.session()
            panels = dict(panels)
            sections = session_sections(panels)
        else:  # a notebook without the app: the figures it was given
            name, panels = self.model.family.name, {}
            sections = [RecordSection("Figures", figures=self._current())] if self.source is not None else []
        if not any(s.attention_pages for s in sections) and self.text_a.value.strip():  # the sentence above
            result = self._attention()
            title, page = attention_page(result)
            a, b = self.text_a.value, self.text_b.value.strip() or None
            inputs = [("Sentence A", a)] + ([("Sentence B", b)] if b else [])
            sections.append(RecordSection("Attention view", inputs, attention_pages={title: page}))
        header = session_header(self.model, name, panels, student=self.student.value.strip())
        shown = [s for s in sections if s.inputs or s.figures or s.attention_pages]
        return lab_record_html(header, sections), len(shown)

    # -- helpers -----------------------------------------------------------------------------
    def _attention(self) -> AttentionResult:
        """The attention of the sentence (pair) typed here."""
        b = self.text_b.value.strip() or None
        return attention_patterns(self.model, self.tok, self.text_a.value, b, max_length=self.max_length)

    def _current(self) -> dict[str, go.Figure]:
        return dict(self.source()) if self.source is not None else {}

    def _list_figures(self) -> list[tuple[Level, str]]:
        """Fill the dropdown with the figures on show now (keeps the pick); notes for the student."""
        if self.source is None:
            self.choice.options, self.choice.disabled = [], True
            return [("info", "No other tabs here, so no figures to list; the attention view export works.")]
        names = sorted(self._current())
        kept = self.choice.value if self.choice.value in names else (names[0] if names else None)
        self.choice.options, self.choice.value = names, kept
        notes: list[tuple[Level, str]] = [(
            "info", f"{len(names)} figure(s) on show in the tabs you opened." if names else
            "No figures yet: open a tab that draws one (Mask, Attention, ...), then press Refresh.",
        )]
        problem = static_export_problem()
        if problem:
            notes.append(("warning", f"{problem} HTML export works."))
        return notes

    def _deliver(self, data: bytes, filename: str) -> list[tuple[Level, str]]:
        """Save a copy of `data` to the folder and show a download link for it; notes saying where it went.
        Class mode: the copy goes to the workspace (never named to the student, never served).
        The download has the copy's name, the one the note gives: a name taken already (in the folder,
        or by an earlier download here) gets the time added (`stamped`), so a repeated export is not
        renamed by the browser ("name (1).png") nor saved under another name than it is announced."""
        given = self._folder is not None and (self.workspace.confined or self.folder.value.strip() == str(self._folder))
        # the folder the program gave (as given); else one typed: a plain folder in the working one (export_folder)
        folder = Path(self._folder) if given else self.workspace.export_folder(self.folder.value)
        with contextlib.suppress(OSError):  # a folder that cannot be read: the save says why below
            if filename in self._given or (folder / filename).exists():
                filename = stamped(filename, self.clock())
        note: tuple[Level, str] | None = None  # class mode: the copy is never named to the student
        try:
            filename = save_export(data, folder, filename).name  # "-2" only for two exports in one second
            if not self.workspace.confined:
                note = ("info", f"Saved {folder.resolve() / filename}; the link below downloads it.")
        except OSError as e:
            if self.workspace.confined:
                log.warning("could not keep a copy of %s in the workspace", filename, exc_info=True)
            else:
                note = ("warning", f"Made {filename}. {os_error_message(e, 'save it in the folder', folder)} The "
                                   "link below downloads it.")
        self._given.add(filename)
        self.link.value = download_link(data, filename)
        return [note or ("info", f"Made {filename}: the link below downloads it to your computer.")]


def _view_notes(result: AttentionResult) -> list[tuple[Level, str]]:
    """What the page holds, and what the student should know about this input."""
    pair = f" (sentence B from token {result.sentence_b_start})" if result.sentence_b_start is not None else ""
    holds = (f"The page holds {len(result.tokens)} tokens{pair}; {result.num_layers} layers × "
             f"{result.num_heads} heads, in the head view and the model view.")
    return [("info", holds), *input_notes(result.warning, result.tokens, result.unk_token)]

