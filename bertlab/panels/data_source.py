"""Where a fine-tuning run reads its data: the task's copy under BERTLAB_DATA, a path (in class mode, inside
the class data folder or the student's workspace), or an uploaded file, read once and cached. Errors name
the uploaded file as the student knows it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ipywidgets as widgets

from bertlab.inputs import InputError
from bertlab.panels.base import Panel
from bertlab.settings import DataNotFoundError, data_dir, upload_max_bytes
from bertlab.tasks import DataSourceError, DataSplit, get_task, read_train_dev
from bertlab.viz.finetune_words import data_note
from bertlab.viz.theme import help_html
from bertlab.workspace import UploadTooLarge, Workspace, save_upload


class DataSource:
    """The data widgets (a choice, a path, an upload, a note) of a panel that trains on a task; messages go
    to `owner`'s message line. `task()` names the task whose format an upload must have."""

    def __init__(self, owner: Panel, workspace: Workspace, task: Callable[[], str]) -> None:
        self.owner, self.workspace, self.task = owner, workspace, task
        self._cache: dict[tuple[str, str], DataSplit] = {}
        self._upload_path: Path | None = None
        self._upload_name = ""  # the file's name on the student's machine
        style = {"description_width": "initial"}
        self.choice = widgets.Dropdown(
            options=[("BERTLAB_DATA folder", "default"), ("a path (file or folder)", "path"),
                     ("an uploaded file", "upload")],
            value="default", description="Data", style=style, layout=widgets.Layout(width="300px"),
        )
        self.path = widgets.Text(placeholder="data file or folder", continuous_update=False,
                                 layout=widgets.Layout(width="min(100%, 340px)"))
        self.upload = widgets.FileUpload(accept=".tsv,.txt,.json,.conll", multiple=False, description="Upload")
        self.note = widgets.HTML()
        self.choice.observe(self._show_note, names="value")
        self.path.observe(self._on_path, names="value")
        self.upload.observe(self._on_upload, names="value")
        self._show_note()
        self.widget = widgets.VBox([widgets.HBox([self.choice, self.path, self.upload]), self.note])

    def chosen(self) -> str | None:
        """Where the chosen source reads from (None: BERTLAB_DATA); InputError when it is not set yet."""
        return self.source(self.choice.value)

    def _show_note(self, _=None) -> None:
        self.path.disabled = self.choice.value != "path"
        uploaded = self._upload_name if self._upload_path else None
        limit = upload_max_bytes() if self.workspace.confined else None  # class mode: what the fields accept
        self.note.value = help_html(data_note(self.choice.value, str(data_dir()), uploaded, limit), "span")

    def _on_path(self, change) -> None:
        if change["new"].strip() and self.choice.value != "path":
            self.choice.value = "path"

    def _on_upload(self, change) -> None:
        """Save the file and read it at once: a malformed file is named with its line here."""
        with self.owner.reporting():
            if not change["new"]:
                return
            entry = change["new"][0]
            try:
                self.workspace.check_upload(memoryview(entry["content"]).nbytes)  # class mode: size-limited
            except UploadTooLarge:
                self.upload.value = ()  # do not keep the refused bytes in the kernel
                raise
            self._upload_path = save_upload(entry, self.workspace.uploads)
            self._upload_name = str(entry.get("name") or self._upload_path.name)
            self._cache = {k: v for k, v in self._cache.items() if k[1] != str(self._upload_path)}
            self.choice.value = "upload"
            self._show_note()
            self.check_upload()

    def check_upload(self) -> None:
        with self.owner.reporting():
            if self._upload_path is None:
                raise InputError("Upload a data file first (the Upload button).")
            split = self.read(self.task(), self.source("upload"))
            self.owner.show_message(split.note)

    def source(self, kind: str) -> str | None:
        """Where `kind` ("default", "path", "upload") reads from: None for BERTLAB_DATA."""
        if kind == "path":
            path = self.path.value.strip()
            if not path:
                raise InputError("Type the path of a data file or folder (or pick BERTLAB_DATA).")
            return str(self.workspace.resolve(path, "data"))  # class mode: the workspace and BERTLAB_DATA only
        if kind == "upload":
            if self._upload_path is None:
                raise InputError("Upload a data file first (the Upload button), or pick another data source.")
            return str(self._upload_path)
        return None

    def read(self, task: str, source: str | None) -> DataSplit:
        """The examples of `task` from `source` (None = BERTLAB_DATA), cached; errors name the
        uploaded file as the student knows it."""
        key = (task, source or "")
        if key not in self._cache:
            try:
                self._cache[key] = read_train_dev(get_task(task), source)
            except (ValueError, DataNotFoundError, DataSourceError) as e:
                text = str(e)
                if self._upload_path is not None:
                    text = text.replace(str(self._upload_path), self._upload_name)
                text = self.workspace.hide_root(text)
                raise InputError(text) from e
        return self._cache[key]
