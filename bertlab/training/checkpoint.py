"""Training checkpoints: HF model files plus what a resume needs, written atomically.

A checkpoint is a folder `out_dir/checkpoint-<step>` holding

- the model in HF layout (`config.json`, `model.safetensors`, tokenizer files), written by
  `bertlab.loading.save_pretrained` for a bertlab `Bert` (so `transformers` loads it too), or a
  bare `model.safetensors` for any other `nn.Module`;
- `optimizer.pt` and `scheduler.pt` (torch state dicts);
- `trainer_state.json`: step, epoch, metrics history, RNG states, the training config.

Every checkpoint is first written into a hidden temp folder next to its target, fsynced, then
renamed into place, so a crash mid-write never leaves a half-written `checkpoint-<step>`.
`save_model_atomically` writes a final model the same way. A full disk is reported as
`DiskFullError` ("the disk is full while writing <folder>"), whichever writer noticed it.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
WEIGHTS_FILE = "model.safetensors"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


class TrainingStateError(RuntimeError):
    """A checkpoint that cannot be written or read back."""


class DiskFullError(TrainingStateError):
    """The disk filled up while a checkpoint or a model was being written."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(
            f"the disk is full while writing {folder}: free some space (or write to a folder on another disk, "
            f"e.g. --out elsewhere) and run again."
        )
        self.folder = Path(folder)


_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# How the writers word a full disk: the OS, safetensors (Rust's io::Error), torch.save's zip writer.
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "storagefull")
_TORCH_ZIP_FULL = ("unexpected pos", "file write failed")  # "[enforce fail at inline_container.cc:672] ..."


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is the disk filling up: OSError ENOSPC,
    torch's "[enforce fail at inline_container.cc:...] unexpected pos" RuntimeError, or the same
    from safetensors."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFullError) or (isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS):
            return True
        text = str(e).lower()
        if any(t in text for t in _DISK_FULL_TEXT):
            return True
        if "inline_container" in text and any(t in text for t in _TORCH_ZIP_FULL):
            return True
        e = e.__cause__ or e.__context__
    return False


def write_error(error: Exception, folder: str | Path, what: str = "write") -> TrainingStateError:
    """The error to raise when writing `folder` failed: DiskFullError for a full disk."""
    if is_disk_full(error):
        return DiskFullError(folder)
    return TrainingStateError(f"could not {what} {folder}: {error}")


@dataclass
class TrainerState:
    """Where a run stands: everything besides weights and optimizer that a resume restores."""

    step: int  # optimizer steps done
    epoch: int  # epochs started (0-based index of the current epoch)
    total_steps: int
    num_examples: int  # size of the training data the run was started on
    world_size: int = 1
    history: list[dict[str, Any]] = field(default_factory=list)  # one dict per log / eval
    rng: list[dict[str, Any]] = field(default_factory=list)  # one entry per rank (see rng_state)
    config: dict[str, Any] = field(default_factory=dict)  # TrainConfig as a dict
    status: str = "running"  # "running", "completed", "cancelled"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        d = json.loads(text)
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


# -- RNG -------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The global torch RNG states (CPU, and every CUDA device), as JSON-friendly base64."""
    state: dict[str, Any] = {"torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state()` returned."""
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [_unb64(s) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "the checkpoint holds CUDA RNG states for %d devices but %d are visible; "
                "dropout will not repeat the interrupted run exactly.",
                len(cuda),
                torch.cuda.device_count(),
            )


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


# -- finding checkpoints ---------------------------------------------------------------------
def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"{CHECKPOINT_PREFIX}{step}"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints in `out_dir`, oldest step first (temp and trash folders ignored)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = []
    for p in out_dir.iterdir():
        m = _CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in `out_dir`, or None."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


# -- writing ---------------------------------------------------------------------------------
def save_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    tokenizer: Tokenizer | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainerState,
    keep_last: int | None = None,
) -> Path:
    """Write `out_dir/checkpoint-<state.step>` atomically, then keep only the newest `keep_last`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = checkpoint_path(out_dir, state.step)
    tmp = out_dir / f"{_TMP_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}"
    _remove_stale(out_dir)
    with _staged(tmp, target, "write checkpoint"):
        save_model_files(model, tokenizer, tmp)
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        torch.save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        (tmp / STATE_FILE).write_text(state.to_json(), encoding="utf-8")
    log.info("checkpoint written: %s", target)
    if keep_last is not None:
        prune_checkpoints(out_dir, keep_last)
    return target


@contextlib.contextmanager
def _staged(tmp: Path, target: Path, what: str) -> Iterator[Path]:
    """Make the empty folder `tmp` for the caller to fill; then fsync it and rename it onto `target`.
    The new folder keeps the mode of the `target` it replaces (a private run folder stays private).
    If anything fails, `tmp` is removed and `target` left as it was (a write error such as a full
    disk comes out as `write_error(..., target, what)`)."""
    try:
        tmp.mkdir(mode=0o700)
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode) if target.is_dir() else 0o777 & ~_umask())
        yield tmp
        _fsync_tree(tmp)
    except BaseException as e:
        _remove_tree(tmp)
        if isinstance(e, Exception):
            raise write_error(e, target, what) from e
        raise
    _swap_into_place(tmp, target)


def _umask() -> int:
    """The process's umask: from /proc where Linux shows it (no window in which another thread's files
    get a changed mask), else by setting it and putting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_model_files(model: torch.nn.Module, tokenizer: Tokenizer | None, folder: Path) -> None:
    """HF layout via `bertlab.loading.save_pretrained` for a bertlab Bert; else model.safetensors."""
    if _is_bert(model):
        from bertlab.loading import save_pretrained

        save_pretrained(model, tokenizer, folder)
        return
    _st_save_model(model, str(folder / WEIGHTS_FILE))
    if tokenizer is not None:
        tokenizer.save(folder)


# Files of a model folder that a new save replaces (never carried over from the old folder).
_MODEL_FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _is_model_file(name: str) -> bool:
    """A file of the old model (replaced), or a writer's leftover temp file (dropped)."""
    return (name in _MODEL_FILES or name.endswith(".safetensors") or (name.startswith(".") and name.endswith(".tmp"))
            or (name.startswith("pytorch_model-") and name.endswith(".bin")))


def save_model_atomically(model: torch.nn.Module, tokenizer: Tokenizer | None, folder: str | Path) -> Path:
    """Write a model (HF layout, see `save_model_files`) into `folder` all at once: into a hidden
    temp folder beside it, fsynced, then renamed into place. What else `folder` holds (checkpoints/,
    a results file) is carried over as hard links; its old model files are replaced. A crash leaves
    `folder` as it was (or, in the instant between two renames, absent: the old folder then sits
    beside it as `.trash-<name>-...`); never a folder that half-loads. A full disk raises DiskFullError."""
    folder = Path(folder)
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_beside(folder)
    tmp = parent / f"{_TMP_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}"
    with _staged(tmp, folder, "write the model to"):
        save_model_files(model, tokenizer, tmp)
        written = {p.name for p in tmp.iterdir()}
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name not in written and not _is_model_file(entry.name):
                    _link(entry, tmp / entry.name)
    log.info("model written: %s", folder)
    return folder


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write a small text file through a temp file and a rename: never half there."""
    path = Path(path)
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise write_error(e, path) from e


def _link(src: Path, dst: Path) -> None:
    """Hard-link a file, or a folder's files (no data copied); copy where links are refused."""
    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        link_or_copy(str(src), str(dst))


def _remove_stale_beside(folder: Path) -> None:
    """Temp folders of `folder` left by a crash; its trash folders too when `folder` is there
    (when it is not, the newest trash folder is the last complete save: kept, and named)."""
    if not folder.parent.is_dir():
        return
    tmp, trash = f"{_TMP_PREFIX}{folder.name}-", f"{_TRASH_PREFIX}{folder.name}-"
    for p in folder.parent.iterdir():
        if not p.is_dir():
            continue
        if p.name.startswith(tmp) or (p.name.startswith(trash) and folder.exists()):
            log.info("removing %s left by an interrupted save", p)
            _remove_tree(p)
        elif p.name.startswith(trash):
            log.warning("%s is missing but %s holds the model saved before an interrupted save: "
                        "rename it back to keep it.", folder, p)


def prune_checkpoints(out_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (each renamed away before deletion)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1 (got {keep_last}).")
    for old in list_checkpoints(out_dir)[:-keep_last]:
        remove_checkpoint(old)


def remove_checkpoint(folder: str | Path) -> None:
    """Delete a checkpoint folder; it is renamed away first, so it never looks half there."""
    folder = Path(folder)
    trash = folder.with_name(f"{_TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}")
    os.rename(folder, trash)
    _remove_tree(trash)


def _swap_into_place(tmp: Path, target: Path) -> None:
    # A folder cannot be renamed over a non-empty one: move the old one aside first.
    trash = None
    if target.exists():
        trash = target.with_name(f"{_TRASH_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}")
        os.rename(target, trash)
    os.rename(tmp, target)
    _fsync_dir(target.parent)
    if trash is not None:
        _remove_tree(trash)


def _remove_stale(out_dir: Path) -> None:
    """Temp and trash folders left by a crash: never checkpoints, safe to delete."""
    for p in out_dir.iterdir():
        if p.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)) and p.is_dir():
            log.info("removing %s left by an interrupted checkpoint write", p)
            _remove_tree(p)


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in folder.rglob("*")} | {folder}):
        _fsync_dir(d)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_tree(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# -- reading ---------------------------------------------------------------------------------
def read_state(folder: str | Path) -> TrainerState:
    """The `trainer_state.json` of a checkpoint folder."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise TrainingStateError(
            f"{folder} is not a training checkpoint: it has no {STATE_FILE}. "
            f"Pass a checkpoint-<step> folder (see latest_checkpoint(out_dir))."
        )
    try:
        return TrainerState.from_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, TypeError) as e:
        raise TrainingStateError(f"{path} could not be read: {e}") from e


def load_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> TrainerState:
    """Load weights (strict), optimizer and scheduler from `folder` into the given objects."""
    folder = Path(folder)
    state = read_state(folder)
    load_model_weights(model, folder)
    device = next(model.parameters()).device
    for obj, name in ((optimizer, OPTIMIZER_FILE), (scheduler, SCHEDULER_FILE)):
        if obj is None:
            continue
        try:
            obj.load_state_dict(torch.load(folder / name, map_location=device, weights_only=True))
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            raise TrainingStateError(f"{folder / name} could not be restored: {e}") from e
    return state


def load_model_weights(model: torch.nn.Module, folder: str | Path) -> None:
    """Copy the weights saved in `folder` into `model`; key sets and shapes must match."""
    folder = Path(folder)
    device = next(model.parameters()).device
    try:
        if _is_bert(model):
            from bertlab.loading import load_model

            saved, _ = load_model(folder)
            model.load_state_dict(saved.state_dict(), strict=True)
        else:
            _st_load_model(model, folder / WEIGHTS_FILE, strict=True, device=str(device))
    except (OSError, RuntimeError, ValueError) as e:
        raise TrainingStateError(
            f"the weights in {folder} do not fit this model ({e}). Resume with the same model "
            f"architecture and heads that wrote the checkpoint."
        ) from e


def _is_bert(model: torch.nn.Module) -> bool:
    """A bertlab model of any family (BERT, RoBERTa, ALBERT, ELECTRA, ...): saved in the HF layout."""
    try:
        from bertlab.families import FamilyModel
        from bertlab.families.bert import Bert
    except ImportError:
        return False
    return isinstance(model, (Bert, FamilyModel))
