"""The model picker above every tab: the offline default, a hub name, a local folder, or a
model made in the training tabs. Switching here updates every tab (see ModelState)."""

from __future__ import annotations

import logging
import os
import weakref

import ipywidgets as widgets

from bertlab import hub
from bertlab.analysis.classics import guess_classics
from bertlab.inputs import echo
from bertlab.panels.base import Panel, busy_html
from bertlab.panels.runs import BackgroundRun, in_background
from bertlab.panels.state import DEFAULT_NAME, ModelState
from bertlab.panels.views import Hold
from bertlab.settings import in_hub_cache
from bertlab.viz.picker import hub_options, model_card, model_lacks, small_note
from bertlab.viz.theme import BOX_BORDER, help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

HELP = (
    "Type a Hugging Face name (e.g. bert-base-uncased: needs the network or the hub cache) "
    "or a local folder with config.json + model.safetensors, then press Load. default-encoder is the "
    "offline default's encoder as its package ships it (no heads): what fine-tuning starts from."
)
CLASS_HELP = (
    "Type a model name from this server's Hugging Face cache, a folder your teacher shared, or a run of "
    "yours (the folder the Fine-tuning tab names, e.g. runs/...), then press Load."
)
NOT_HERE = "not on this server: ask your teacher to run `bertlab download {name}` before class"


class ModelPicker(Panel):
    """Pick or load the model every tab shows."""

    title = "Model"

    def __init__(self, state: ModelState, workspace: Workspace | None = None) -> None:
        """`workspace`: which typed folders Load may read (default: this session's, see bertlab.workspace)."""
        super().__init__()
        self.state = state
        self.workspace = workspace or Workspace.for_session()
        self._offer_runs(self.workspace)  # a reloaded page lists what this workspace trained
        self.workspace.on_adopt(self._offer_runs)  # class mode: the browser's workspace, once the page comes
        self.choice = widgets.Dropdown(
            options=list(state.entries), value=state.name, description="Model",
            layout=widgets.Layout(flex="0 1 auto"),  # as wide as the longest name, shrinking before Load wraps
        )
        self.source = widgets.Text(
            placeholder="cached hub name, shared folder or runs/..." if self.workspace.confined
            else "hub name or local folder", layout=widgets.Layout(width="auto", flex="1 1 160px", max_width="360px"),
        )
        self.load_button = widgets.Button(description="Load", tooltip="Load this model and show it in every tab",
                                          layout=widgets.Layout(width="auto", flex="0 0 auto"))
        self._classics: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its classics, once
        self.card = widgets.HTML(self._card(state))
        self.hold = Hold()  # set while _on_state rewrites the dropdown (its changes are not the student's)
        self.help = widgets.HTML(help_html(CLASS_HELP if self.workspace.confined else HELP))
        # Recommended hub models: size, download progress, then load (in a background thread).
        self.hub_choice = widgets.Dropdown(options=hub_options(self.workspace.confined), value="",
                                           description="Hub", layout=widgets.Layout(width="auto", flex="1 1 240px",
                                                                                   max_width="520px"))
        self.get_button = widgets.Button(description="Download and load", disabled=True,
                                         tooltip="Download the files bertlab reads (once), then load the model",
                                         layout=widgets.Layout(width="auto"))
        self.hub_info = widgets.HTML()  # size, progress text, busy sign
        self.progress = widgets.FloatProgress(value=0, min=0, max=1, layout=widgets.Layout(display="none"))
        self.download = BackgroundRun("bertlab-hub-download")
        self.hub_choice.observe(self._on_hub_choice, names="value")
        self.get_button.on_click(self._on_get)
        self.choice.observe(self._on_choice, names="value")
        self.load_button.on_click(self._on_load)
        self.source.continuous_update = False
        state.observe(self._on_state)
        self._widget = widgets.VBox(
            [widgets.HBox([self.choice, self.source, self.load_button], layout=widgets.Layout(flex_flow="row nowrap")),
             widgets.HBox([self.hub_choice, self.get_button, self.progress, self.hub_info],
                          layout=widgets.Layout(flex_flow="row wrap", align_items="center")),
             self.card, self.message],
            layout=widgets.Layout(width="100%", border=BOX_BORDER, padding="4px 8px"),
        )

    def _on_choice(self, change) -> None:
        if self.hold or change["new"] == self.state.name:
            return
        with self.reporting():
            self.show_message(f"Loading {change['new']}…")
            self.state.switch(change["new"])
            self.show_messages([])

    def _on_load(self, _=None) -> None:
        source = self.source.value.strip()
        with self.reporting():
            if not source:
                raise ValueError("Type a Hugging Face model name or a local folder first.")
            where = self.workspace.model_source(source)  # class mode: the cache, allowed folders, the workspace
            listed = self.state.listed_as(where)
            if listed is not None:  # e.g. "default": the entry the list has already, not a second copy
                self._show_listed(source, listed)
                return
            self.load_button.disabled = True
            self.show_message(f"Loading {source}…")
            try:
                self._load(source, where)
            finally:
                self.load_button.disabled = False

    def _show_listed(self, source: str, listed: str) -> None:
        """`source` is a model the list has already (as `listed`): show it, load nothing."""
        shown = self.state.name == listed
        if not shown:
            self.state.switch(listed)
        what = "is the model on show" if shown else "is in the model list already: every tab now shows it"
        named = "" if listed == source else f" (listed as “{listed}”)"
        self.show_message(f"{echo(source)}{named} {what}.")

    # -- recommended hub models -----------------------------------------------------------------
    def _on_hub_choice(self, change) -> None:
        """Say what the chosen model weighs (asking the hub, in the background) or that it is cached."""
        name = change["new"]
        self.get_button.disabled = not name or self.download.running
        self.hub_info.value = ""
        if not name:
            return
        if in_hub_cache(name):
            self.get_button.description = "Load"
            size = hub.human_size(hub.cached_size(name))
            self.hub_info.value = small_note(f"{name} is in this machine's cache ({size}): no download needed.")
        elif self.workspace.confined:  # class mode: students never download; the teacher fills the cache
            self.get_button.disabled = True
            self.hub_info.value = small_note(NOT_HERE.format(name=name))
        else:
            self.get_button.description = "Download and load"
            self.hub_info.value = busy_html(f"Asking the hub how large {name} is…")
            in_background(lambda: self._show_size(name), "bertlab-hub-size")

    def _show_size(self, name: str) -> None:
        try:
            text = f"{name}: {hub.human_size(sum(f.size for f in hub.remote_files(name)))} to download."
        except hub.HubError as e:
            text = str(e)
        if self.hub_choice.value == name and not self.download.running:
            self.hub_info.value = small_note(text)

    def _on_get(self, _=None) -> None:
        name = self.hub_choice.value
        if not name or self.download.running:
            return
        if self.workspace.confined and not in_hub_cache(name):
            self.show_message(NOT_HERE.format(name=name), "warning")
            return
        self.get_button.disabled = self.load_button.disabled = True
        self.progress.value, self.progress.layout.display = 0, None
        self.hub_info.value = busy_html(f"Getting {name}…")
        self.download.start(lambda: self._download_and_load(name), on_done=self._downloaded)

    def _download_and_load(self, name: str) -> None:
        """The background job: download (with byte progress) unless cached, then load and switch."""
        def progress(done: int, total: int) -> None:
            self.progress.max = max(total, 1)
            self.progress.value = done
            self.hub_info.value = busy_html(f"Downloading {name}: {hub.human_size(done)} of {hub.human_size(total)}")

        with self.reporting():
            if not in_hub_cache(name):
                hub.download(name, progress=progress)
            self.hub_info.value = busy_html(f"Loading {name}…")
            self._load(name, self.workspace.model_source(name))

    def _downloaded(self) -> None:
        self.progress.layout.display = "none"
        self.hub_info.value = ""
        self.get_button.disabled = self.load_button.disabled = False
        self.hub_choice.options = hub_options(self.workspace.confined)  # now marked cached
        self.hub_choice.value = ""

    def _load(self, source: str, where: str) -> None:
        """Load `where`, add it to the list as `source`, switch every tab to it and say what it lacks."""
        from bertlab.loading import load

        try:
            model, tok = load(where)
        except ValueError as e:  # its message may name the workspace's folder: say runs/... instead
            raise ValueError(self.workspace.hide_root(str(e))) from e
        self.state.add(source, model, tok, source=where, switch=True)
        notes = [("info", f"Loaded {source}: every tab now shows it.")]
        missing = model_lacks(model)
        if missing and model.family.causal:
            notes.append(("info", f"{model.family.title} reads left to right: it guesses the next word (the Mask tab "
                                  f"shows it) and has no {' / '.join(missing)}; the tabs that need one say so."))
        elif missing:
            notes.append(("warning", f"It has no {' / '.join(missing)}: the tabs that need one say so."))
        self.show_messages(notes)

    def _offer_runs(self, workspace: Workspace) -> None:
        for run in workspace.finished_runs():
            self.state.offer(workspace.shown(run), os.path.realpath(run))

    def _on_state(self, state: ModelState) -> None:
        """Another part of the app added or switched a model: list it and show its card."""
        with self.hold():
            self.choice.options = list(state.entries)
            self.choice.value = state.name
        self.card.value = self._card(state)

    def _card(self, state: ModelState) -> str:
        """The model's card, with how it guesses the lectures' examples (one batched forward per model)."""
        model = state.model
        if model not in self._classics:
            try:
                self._classics[model] = guess_classics(model, state.tok) if model.has_mlm else None
            except Exception:  # the card still says what the model is
                log.exception("scoring the lectures' examples failed")
                self._classics[model] = None
        return model_card(model, state.name, self._classics[model], real_bert=state.name == DEFAULT_NAME)

