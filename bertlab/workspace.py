"""One student's workspace, and the one gate that every path a student types goes through.

In class mode (`settings.class_mode()`) each kernel, that is each open dashboard page, gets a
private folder (mode 0o700) under `settings.workspaces_dir()`, named by a random token that no
other student can guess or list: `runs/` for training runs, `uploads/` for uploaded files,
`exports/` for copies of exported figures. A typed path is accepted only inside that folder or
BERTLAB_DATA (for models also the teacher's folders, BERTLAB_ALLOW_MODELS, and the Hugging Face
hub cache), after `realpath`, so neither `..` nor a symlink leads out; anything else gets one
message that says nothing about whether the path exists. In one-person mode paths are free,
as before. Run folders get unique names in both modes. Nothing here ever deletes a workspace:
what a student saved stays when a session ends (a teacher clears old ones by their date prefix).

A reload keeps the workspace: the class server gives each browser a random key in an HttpOnly cookie
and passes it to the page's kernel as a request header (`KEY_ENV`); the kernel then `adopt`s the
workspace named after the key's hash, which the same browser's earlier pages used. A pre-heated
kernel learns the key only when a page is handed to it, through Voila's `wait_for_request`.

    ws = Workspace.for_session()
    path = ws.resolve(text, "data")        # PathNotAllowed (a ValueError) outside the workspace
    out = ws.new_run_dir("sst2-full")      # a new folder under ws.runs, made atomically
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Literal

from bertlab import settings
from bertlab.inputs import InputError, check_path_text, echo

log = logging.getLogger(__name__)

Kind = Literal["data", "model"]

RUNS_DIR = "bertlab-runs"  # one-person mode: runs go here, relative to the working folder (as before)
EXPORTS_DIR = "bertlab-exports"  # one-person mode: the Export tab's default folder
SUBFOLDERS = ("runs", "uploads", "exports")
PRIVATE = 0o700
RUN_ROOM_BYTES = 600 * 2**20  # room a fine-tune of the offline default takes while it trains (checkpoint, snapshots)
REFUSED: dict[str, str] = {
    "data": ("Only files in your workspace or the class data folder can be used here: upload your file, "
             "or pick the class data."),
    "model": ("Only models in the list, the Hugging Face cache, the teacher's model folders or your workspace "
              "can be loaded here: pick a model from the list, or type a run folder of yours (runs/...)."),
}
_PLAIN_NAME = re.compile(r"[\w][\w .-]*")  # a folder name an export may go to: no markup, no leading dot
_KEY = re.compile(r"[0-9a-f]{64}")  # a browser's workspace key, as the class server makes it
KEY_ENV = "HTTP_X_BERTLAB_WORKSPACE"  # where Voila puts the page's X-Bertlab-Workspace header in the kernel
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


class PathNotAllowed(ValueError):
    """A typed path outside what this session may use (the message never says whether it exists)."""


class UploadTooLarge(ValueError):
    """An upload over the class limit (`settings.upload_max_bytes()`)."""


class NoRoomForRun(ValueError):
    """A run that would not fit: the workspace's share (class mode) or the disk is full, or nearly."""


class Workspace:
    """Where one session's files go, and which typed paths it may use.

    root: the private folder (class mode; made on first use), or None for one-person mode,
    where typed paths are free and runs go to RUNS_DIR.
    """

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(os.path.realpath(root)) if root is not None else None
        self._made = False
        self._lock = threading.Lock()
        self._tmp_uploads: Path | None = None
        self._on_adopt: list[Any] = []

    @classmethod
    def new(cls, parent: str | os.PathLike | None = None) -> Workspace:
        """A fresh private workspace under `parent` (default `settings.workspaces_dir()`),
        named `<date>-<random token>`; its folder is made when first needed."""
        parent = Path(parent) if parent is not None else settings.workspaces_dir()
        return cls(parent / f"{time.strftime('%Y%m%d')}-{secrets.token_urlsafe(18)}")

    @classmethod
    def for_session(cls) -> Workspace:
        """This kernel's workspace (one kernel serves one page): private in class mode, free otherwise."""
        return _session(settings.class_mode(), str(settings.workspaces_dir()))

    def adopt(self, key: str) -> bool:
        """Move this session into the workspace of browser key `key` (`<date>-<hash of key>` under the
        same parent: the one the browser's earlier pages used, or a new one), so that a reloaded page
        finds its runs. Nothing happens (False) in one-person mode, for a key the class server did not
        make, or once this session has put a run or a file in its own folder. Calls `on_adopt`'s callbacks."""
        if self.root is None or not _KEY.fullmatch(key):
            return False
        suffix = hashlib.sha256(key.encode()).hexdigest()[:32]
        parent = self.root.parent
        with self._lock:
            if self.root.name.endswith(suffix):
                return True
            sub = [self.root / name for name in SUBFOLDERS]
            if self._made and any(any(d.iterdir()) for d in sub if d.is_dir()):
                return False  # this page already wrote here: keep it
            earlier = sorted(p for p in parent.glob(f"*-{suffix}") if p.is_dir() and not p.is_symlink())
            old, made = self.root, self._made
            self.root = earlier[-1] if earlier else parent / f"{time.strftime('%Y%m%d')}-{suffix}"
            self._made = False
        if made:  # the empty folder this page had made for itself
            for name in SUBFOLDERS:
                with contextlib.suppress(OSError):
                    (old / name).rmdir()
            with contextlib.suppress(OSError):
                old.rmdir()
        self.make()
        log.info("workspace %s adopted by this page", self.root)
        for callback in list(self._on_adopt):
            callback(self)
        return True

    def on_adopt(self, callback: Any) -> None:
        """Call `callback(workspace)` after `adopt` moved this session (a panel re-lists the runs)."""
        self._on_adopt.append(callback)

    @property
    def confined(self) -> bool:
        """True in class mode: typed paths must stay inside the workspace and the class folders."""
        return self.root is not None

    # -- the folders ----------------------------------------------------------------------------
    @property
    def runs(self) -> Path:
        return self._sub("runs") if self.root is not None else Path(RUNS_DIR)

    @property
    def exports(self) -> Path:
        return self._sub("exports") if self.root is not None else Path(EXPORTS_DIR)

    @property
    def uploads(self) -> Path:
        if self.root is not None:
            return self._sub("uploads")
        if self._tmp_uploads is None:  # one-person mode: a temporary folder, as before
            self._tmp_uploads = Path(tempfile.mkdtemp(prefix="bertlab-upload-"))
        return self._tmp_uploads

    def _sub(self, name: str) -> Path:
        self.make()
        return self.root / name

    def make(self) -> None:
        """Create the private folder and its subfolders (mode 0o700, whatever the umask); idempotent."""
        if self.root is None or self._made:
            return
        with self._lock:
            if self._made:
                return
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.root.mkdir(mode=PRIVATE)
            except FileExistsError:
                if not self.root.is_dir():
                    raise
            os.chmod(self.root, PRIVATE)
            for name in SUBFOLDERS:
                (self.root / name).mkdir(mode=PRIVATE, exist_ok=True)
                os.chmod(self.root / name, PRIVATE)
            self._made = True
            log.info("workspace %s ready", self.root)

    def new_run_dir(self, prefix: str, parent: str | os.PathLike | None = None) -> Path:
        """A new, empty folder `<parent>/<YYYYmmdd-HHMMSS>-<prefix>-<random>` (parent: `self.runs`).
        Made with mkdir(exist_ok=False), so two runs started in the same second never share one.
        NoRoomForRun, before anything is made, when the run would not fit (`check_room`)."""
        parent = Path(parent) if parent is not None else self.runs
        parent.mkdir(parents=True, exist_ok=True)
        self.check_room(parent)
        stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(prefix)}"
        for _ in range(100):
            path = parent / f"{stem}-{secrets.token_hex(3)}"
            try:
                path.mkdir(mode=PRIVATE if self.confined else 0o777)
            except FileExistsError:
                continue
            return path
        raise FileExistsError(f"could not make a new run folder in {parent}")

    def check_room(self, where: str | os.PathLike | None = None, need: int = RUN_ROOM_BYTES) -> None:
        """NoRoomForRun when a run needing `need` bytes while it trains would not fit: in class mode past
        the workspace's share (`settings.workspace_max_bytes()`); in both modes on a disk (that of `where`,
        default the workspace) with less than `need` free. Says how much is used and what to do."""
        if self.confined:
            used, limit = disk_use(self.root), settings.workspace_max_bytes()
            if used + need > limit:
                raise NoRoomForRun(
                    f"Your workspace holds {_size(used)} of the {_size(limit)} each student has here, and a run needs "
                    f"about {_size(need)} while it trains, so it would not fit. Your finished runs stay in the model "
                    "list; ask your teacher to clear old runs or give more room (BERTLAB_WORKSPACE_MB).")
        target = Path(where) if where is not None else (self.root if self.root is not None else Path.cwd())
        free = shutil.disk_usage(_existing(target)).free
        if free < need:
            raise NoRoomForRun(
                f"The disk has {_size(free)} free, and a run needs about {_size(need)} while it trains: it would fill "
                "the disk. " + ("Tell your teacher: the server's disk is full." if self.confined else
                                "Free some space (delete old runs in bertlab-runs/) and start again."))

    def discard_run_dir(self, path: str | os.PathLike) -> bool:
        """Remove a run folder that `new_run_dir` made when nothing was written to it (a Start that failed
        before its run began); True when it was removed. A folder holding anything is left as it is."""
        try:
            os.rmdir(path)  # only an empty folder: never a run that wrote something
        except OSError:
            return False
        return True

    def finished_runs(self) -> list[Path]:
        """The run folders under `runs` that hold a finished model (config.json and its weights, which a
        run writes last and all at once), newest first; [] when there are none (nothing is made)."""
        runs = self.runs if self.root is None or self._made or self.root.is_dir() else None
        if runs is None or not runs.is_dir():
            return []
        found = [p for p in runs.iterdir() if not p.name.startswith(".") and p.is_dir() and not p.is_symlink()
                 and (p / "config.json").is_file() and any(p.glob("*.safetensors"))]
        return sorted(found, key=lambda p: p.name, reverse=True)  # names start with the date and time

    def export_folder(self, user_text: str = "") -> Path:
        """Where exports and lab records go. Class mode: the workspace's `exports/` (what was typed is not
        asked). One-person mode: the folder typed (default EXPORTS_DIR), a plain folder name (or names
        with `/`) inside the working folder: no absolute path, no `~`, nothing that `..` or a link leads
        out of it to, no markup in a name; anything else is an InputError saying what to type."""
        if self.confined:
            return self.exports
        text = check_path_text(user_text.strip(), "folder") or EXPORTS_DIR
        parts = text.replace("\\", "/").split("/")
        if text.startswith(("/", "~")) or any(p == ".." for p in parts) or not all(
                _PLAIN_NAME.fullmatch(p) for p in parts if p not in ("", ".")):
            raise InputError(
                f"The folder {echo(text)} is not a plain folder name inside the working folder: type a name such as "
                f"{EXPORTS_DIR} or exports/week-1 (letters, digits, spaces, - _ . only; no / or ~ at the start, "
                "no ..).")
        home = Path(os.path.realpath(Path.cwd()))
        folder = Path(os.path.realpath(home / text))
        if not _within(folder, home):  # a link that leads out
            raise InputError(f"The folder {echo(text)} leads outside the working folder: type another name, "
                             f"e.g. {EXPORTS_DIR}.")
        return folder

    # -- the gate for typed paths ---------------------------------------------------------------
    def resolve(self, user_text: str, kind: Kind = "data") -> Path:
        """The file or folder a student typed, as a real path this session may read.

        One-person mode: the path as typed (~ expanded). Class mode: relative paths are looked
        up in the workspace, then in BERTLAB_DATA; the real path (symlinks and `..` resolved)
        must lie inside the workspace or BERTLAB_DATA (for models also the teacher's folders
        and the hub cache), else PathNotAllowed with REFUSED[kind], whether it exists or not.
        """
        text = check_path_text(user_text.strip())
        if not self.confined:
            return Path(text).expanduser()
        refused = PathNotAllowed(REFUSED[kind])
        if not text or "\x00" in text:
            raise refused
        try:
            typed = Path(text).expanduser()
        except RuntimeError:  # "~someone" with no such home
            raise refused from None
        candidates = [typed] if typed.is_absolute() else [self.root / typed, settings.data_dir() / typed]
        roots = self._roots(kind)

        def allowed(path: Path) -> bool:
            return any(_within(path, r) for r in roots)

        for candidate in candidates:
            if os.path.lexists(candidate):  # the one the student means (a link counts: it decides by its target)
                real = Path(os.path.realpath(candidate))
                if allowed(real):
                    return real
                raise refused
        missing = [p for p in (Path(os.path.realpath(c)) for c in candidates) if allowed(p)]
        if not missing:
            raise refused
        return missing[0]  # inside, but not there (yet): the reader says it is missing

    def model_source(self, user_text: str) -> str:
        """What `bertlab.loading.load` should get for a model the student typed: a folder, or a
        hub name. Class mode: a hub name only when it is in the hub cache, a folder only where
        `resolve(..., "model")` allows it; the models bertlab ships (e.g. default-encoder) always."""
        text = check_path_text(user_text.strip(), "model name or folder")
        if not self.confined or text in settings.BUILT_IN_MODELS:  # shipped with bertlab: nothing outside to reach
            return text
        if _HUB_ID.fullmatch(text) and ".." not in text:
            local = [c for c in (self.root / text, settings.data_dir() / text) if c.exists()]
            if not local:
                if settings.in_hub_cache(text):
                    return text
                raise PathNotAllowed(REFUSED["model"])
        return str(self.resolve(text, "model"))

    def shown(self, path: str | os.PathLike) -> str:
        """A path as the student should see it: relative to the workspace (runs/...) in class mode."""
        text = str(path)
        if self.root is not None and _within(Path(os.path.realpath(text)), self.root):
            return os.path.relpath(os.path.realpath(text), self.root)
        return text

    def hide_root(self, message: str) -> str:
        """`message` with this workspace's folder left out of every path it names."""
        if self.root is None:
            return message
        return message.replace(str(self.root) + os.sep, "").replace(str(self.root), "your workspace")

    def check_upload(self, size: int) -> None:
        """Refuse an upload of `size` bytes over the class limit (class mode only)."""
        limit = settings.upload_max_bytes()
        if self.confined and size > limit:
            raise UploadTooLarge(
                f"That file is {_size(size)}; uploads are limited to {_size(limit)} here. "
                "Upload a smaller file (fewer examples), or ask your teacher to add it to the class data."
            )

    def _roots(self, kind: Kind) -> list[Path]:
        roots = [self.root, settings.data_dir()]
        if kind == "model":
            roots += [*settings.allowed_model_dirs(), settings.hub_cache_dir()]
        return [Path(os.path.realpath(r)) for r in roots]


def save_upload(upload: dict[str, Any], folder: Path) -> Path:
    """Write one uploaded file (an ipywidgets.FileUpload entry: name, content) into `folder` under its own
    name, never a folder the name spells; returns the file."""
    name = Path(str(upload.get("name") or "")).name  # no folders: only the file's own name
    if name in ("", ".", ".."):
        name = "upload"
    path = folder / name
    path.write_bytes(bytes(upload["content"]))
    return path


@functools.cache
def _session(class_mode: bool, parent: str) -> Workspace:
    """One workspace per (mode, root) in this process: every tab of a page shares it."""
    if not class_mode:
        return Workspace(None)
    ws = Workspace.new(parent)
    if os.environ.get("VOILA_KERNEL_ID"):  # a page's kernel: take the browser's workspace when the page comes
        threading.Thread(target=_adopt_when_asked, args=(ws,), name="bertlab-workspace", daemon=True).start()
    return ws


def _adopt_when_asked(ws: Workspace) -> None:
    """Wait for the page this kernel serves (at once unless the kernel is pre-heated), then adopt the
    workspace of the browser's key (`KEY_ENV`, which the class server sets on every page request)."""
    try:
        from voila.utils import wait_for_request

        wait_for_request()
        ws.adopt(os.environ.get(KEY_ENV, ""))
    except Exception:  # no Voila, no page yet (a kernel shut down while pooled): the page keeps its own folder
        log.warning("the page's workspace key could not be read", exc_info=True)


def disk_use(folder: str | os.PathLike) -> int:
    """Bytes the files under `folder` take on disk (a file hard-linked twice counted once); 0 when absent."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, _, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:  # removed meanwhile (a run pruning its checkpoints)
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder above that exists (what disk it will be on)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _size(n: int) -> str:
    if n >= 100 * 2**20:
        return f"{n / 2**20:,.0f} MB"
    return f"{n / 2**20:.3g} MB" if n >= 2**20 else f"{n / 1024:.3g} kB"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "run"
