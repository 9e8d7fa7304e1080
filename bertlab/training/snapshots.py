"""Replay snapshots: a few small copies of a model's weights kept while it trains, to replay later.

    keeper = SnapshotKeeper(run_dir / "replay", count=8)   # a loop callback
    train(model, loss_fn, data, cfg, callbacks=[keeper])
    for snap in list_snapshots(run_dir / "replay"):
        load_snapshot(model_copy, run_dir / "replay", snap.step)

Snapshots are taken at log-spaced steps (0, 1, 2, 4, ... up to the last step: a model changes most at the
start), as the loop's events reach them. Each is one `step-<N>.safetensors` file holding weights only, in
float16: the first (step 0) holds every parameter; later ones only the parameters that train (a frozen
encoder is not stored again), and of a matrix only the rows that moved beyond 0.1 % (an embedding matrix of
which a run touched a few thousand rows), so feature-based and adapter runs stay tiny and full ones small. They live
in their own folder, never among the loop's `checkpoint-<step>` folders, so resuming and pruning
checkpoints do not see them.
Each file is written under a temporary name and renamed into place: never half there.

A finished run's snapshots are then stored as what changed (`compact_snapshots`): each one against the next,
the last against the run's own final weights file (which the run keeps anyway), a matrix as the rows that
moved, in int8 with one scale per row; vectors (biases, LayerNorm) as they are, in float16. The chain is
quantised closed-loop (each delta is taken against what the later snapshots give back, not their exact
weights), so errors do not add up along it. A replay then reads the final weights and walks back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bertlab.training.checkpoint import write_error

log = logging.getLogger(__name__)

REPLAY_DIR = "replay"  # the snapshots' folder inside a run's folder
DEFAULT_COUNT = 8
_NAME = "step-{step:07d}.safetensors"
_NAME_RE = re.compile(r"^step-(\d+)\.safetensors$")
_FULL = "full"  # metadata key: "1" when the file holds every parameter
_BASE = "base"  # metadata key: the step of the full snapshot a partial one was written against
_ROWS = "@rows"  # "<name>@rows": the row indices a row-sparse "<name>" holds
_SCALE = "@scale"  # "<name>@scale": the per-row scale of an int8 "<name>", a change since the next snapshot
_ANCHOR = "anchor"  # metadata: the final weights file a compacted snapshot's chain ends in (relative path)
_ANCHOR_SHA = "anchor_sha256"
_NAMES = "names"  # metadata: the parameters a compacted snapshot gives (JSON list)
ROW_TOLERANCE = 1e-3  # a row moved when a weight changed by more than this share of the row's largest one


class SnapshotError(ValueError):
    """Snapshots that do not fit the model they are loaded into, or that are missing."""


def snapshot_steps(total_steps: int, count: int = DEFAULT_COUNT) -> list[int]:
    """`count` (or fewer) distinct steps from 0 to `total_steps`, log-spaced: 0, then roughly
    geometric steps from 1 up to `total_steps` (always included)."""
    if total_steps < 0 or count < 2:
        raise ValueError(f"need total_steps >= 0 and count >= 2 (got {total_steps}, {count}).")
    if total_steps == 0:
        return [0]
    n = count - 1  # after step 0
    steps = {0, total_steps}
    for i in range(n):
        steps.add(max(1, round(math.exp(math.log(total_steps) * i / max(1, n - 1)))))
    return sorted(s for s in steps if s <= total_steps)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file: the step it was taken at, and whether it holds every parameter."""

    step: int
    path: Path
    full: bool


def list_snapshots(folder: str | Path) -> list[Snapshot]:
    """The snapshots in `folder`, by step (temporary files ignored); [] when there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME_RE.match(p.name)
        if m and p.is_file():
            with safe_open(str(p), "pt") as f:
                full = (f.metadata() or {}).get(_FULL) == "1"
            found.append(Snapshot(int(m.group(1)), p, full))
    return sorted(found, key=lambda s: s.step)


def save_snapshot(model: torch.nn.Module, folder: str | Path, step: int,
                  names: Iterable[str] | None = None, base: Snapshot | None = None) -> Path:
    """Write `model`'s parameters (those in `names`; all when None) as `folder/step-<step>.safetensors`,
    floats in float16. Tied parameters are stored once (under their first name). With `base` (a full
    snapshot of the same run), a matrix whose rows mostly stayed where the base has them keeps only the rows
    that moved by more than ROW_TOLERANCE of their largest weight (an embedding matrix of which training
    touched a few thousand rows; weight decay alone moves the others by far less): the other rows load as
    the base has them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters())
    keep = list(params) if names is None else [n for n in names if n in params]
    tensors: dict[str, torch.Tensor] = {}
    with contextlib.ExitStack() as stack:
        old = stack.enter_context(safe_open(str(base.path), "pt")) if base is not None else None
        old_names = set(old.keys()) if old is not None else set()
        for n in keep:
            t = _small(params[n])
            if n in old_names and t.dim() == 2:
                before = old.get_tensor(n)
                if before.shape == t.shape:
                    moved = (t.float() - before.float()).abs().amax(dim=1)  # [rows]
                    scale = before.float().abs().amax(dim=1).clamp(min=1e-6)  # [rows]
                    rows = (moved > ROW_TOLERANCE * scale).nonzero().flatten()  # [changed rows]
                    if len(rows) < t.shape[0] // 2:
                        tensors[n + _ROWS] = rows
                        t = t[rows].contiguous()
            tensors[n] = t
    path = folder / _NAME.format(step=step)
    tmp = folder / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    meta = {_FULL: "1" if names is None else "0", "step": str(step)}
    if base is not None:
        meta[_BASE] = str(base.step)
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise write_error(e, path) from e
    return path


def _small(p: torch.Tensor) -> torch.Tensor:
    t = p.detach()
    if t.is_floating_point():
        t = t.to(torch.float16)
    return t.to("cpu").contiguous()


def load_snapshot(model: torch.nn.Module, folder: str | Path, step: int) -> set[str]:
    """Copy the weights saved at `step` into `model` in place: the full snapshot it was written against
    (the newest full one at or before `step`), then `step`'s own file over it. Every saved name must be a
    parameter of `model` with the same shape (SnapshotError otherwise). Returns the names of `model`'s
    parameters that no snapshot holds (a head the caller added): they are left as they were."""
    snaps = list_snapshots(folder)
    by_step = {s.step: s for s in snaps}
    if step not in by_step:
        have = ", ".join(str(s.step) for s in snaps) or "none"
        raise SnapshotError(f"no snapshot at step {step} (steps kept: {have}).")
    with safe_open(str(by_step[step].path), "pt") as f:
        meta = f.metadata() or {}
    if _ANCHOR in meta:
        return _load_compacted(model, Path(folder), [s for s in snaps if s.step >= step])
    based_on = meta.get(_BASE)
    base = [by_step[int(based_on)]] if based_on is not None and int(based_on) in by_step else \
        [s for s in snaps if s.full and s.step <= step][-1:]
    if not base or not base[0].full:
        raise SnapshotError(f"no full snapshot for step {step}: the run's first one is missing.")
    params = dict(model.named_parameters())
    stored: set[str] = set()
    with torch.no_grad():
        for snap in dict.fromkeys([base[0], by_step[step]]):
            with safe_open(str(snap.path), "pt") as f:
                keys = set(f.keys())
                for name in sorted(k for k in keys if not k.endswith(_ROWS)):
                    t, p = f.get_tensor(name), params.get(name)
                    rows = f.get_tensor(name + _ROWS) if name + _ROWS in keys else None
                    shape = tuple(t.shape) if rows is None else (None, *t.shape[1:])
                    fits = p is not None and (tuple(p.shape) == shape if rows is None else
                                              (p.dim() == t.dim() and p.shape[1:] == t.shape[1:]))
                    if not fits:
                        what = "no such parameter" if p is None else f"shape {tuple(p.shape)} here"
                        raise SnapshotError(
                            f"{snap.path.name} does not fit this model: {name} {shape} ({what}). "
                            "Replay a run with the model it trained.")
                    if rows is None:
                        p.copy_(t.to(p.dtype))
                    else:
                        p[rows.to(p.device)] = t.to(p.device, p.dtype)
                    stored.add(name)
    return set(params) - stored


def _weights_at(folder: Path, snaps: list[Snapshot], snap: Snapshot) -> dict[str, torch.Tensor]:
    """The float32 weights a not yet compacted snapshot gives: its full base, then its own file over it."""
    with safe_open(str(snap.path), "pt") as f:
        based_on = (f.metadata() or {}).get(_BASE)
    by_step = {s.step: s for s in snaps}
    base = by_step.get(int(based_on)) if based_on is not None else None
    base = base or ([s for s in snaps if s.full and s.step <= snap.step][-1:] or [None])[0]
    if base is None:
        raise SnapshotError(f"no full snapshot for step {snap.step}: the run's first one is missing.")
    out: dict[str, torch.Tensor] = {}
    for part in dict.fromkeys([base, snap]):
        with safe_open(str(part.path), "pt") as f:
            keys = set(f.keys())
            for name in (k for k in keys if not k.endswith(_ROWS)):
                t = f.get_tensor(name).float()
                if name + _ROWS in keys:
                    out[name][f.get_tensor(name + _ROWS)] = t
                else:
                    out[name] = t
    return out


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def compact_snapshots(folder: str | Path, weights_file: str | Path) -> tuple[int, int]:
    """Store a finished run's snapshots in `folder` as what changed (module docstring), their chain ending in
    `weights_file` (the run's final model.safetensors, whose names are the snapshots' parameter names).
    All at once: the new files go to a folder beside `folder` that then takes its place, so a failure (a full
    disk) leaves the snapshots as they were. Returns (bytes before, bytes after); (n, n) when there was
    nothing to do (no snapshots, or compacted already)."""
    folder, weights_file = Path(folder), Path(weights_file)
    snaps = list_snapshots(folder)
    before = snapshot_bytes(folder)
    if not snaps or _is_compacted(snaps[-1]):
        return before, before
    tmp = folder.with_name(f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(mode=0o700)
    try:
        os.chmod(tmp, stat.S_IMODE(folder.stat().st_mode))  # as private as the folder it replaces
        anchor_sha = _file_sha256(weights_file)
        anchor = os.path.relpath(weights_file, folder)
        with safe_open(str(weights_file), "pt") as f:
            weights = {k: f.get_tensor(k).float() for k in f.keys()}
        given: dict[str, torch.Tensor] = {}  # what the snapshots after this one give back, per parameter
        for i, snap in enumerate(reversed(snaps)):
            target = _weights_at(folder, snaps, snap)
            if i == 0:
                given = {n: weights[n].clone() if n in weights and weights[n].shape == t.shape else None
                         for n, t in target.items()}
            tensors = _changes(target, given)
            meta = {_ANCHOR: anchor, _ANCHOR_SHA: anchor_sha, _FULL: "0", "step": str(snap.step),
                    _NAMES: json.dumps(sorted(target))}
            save_file(tensors, str(tmp / snap.path.name), metadata=meta)
        for p in tmp.iterdir():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        trash = folder.with_name(f".trash-{folder.name}-{uuid.uuid4().hex[:8]}")
        os.rename(folder, trash)
        os.rename(tmp, folder)
        shutil.rmtree(trash, ignore_errors=True)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(e, folder, "store the snapshots of") from e
    return before, snapshot_bytes(folder)


def _is_compacted(snap: Snapshot) -> bool:
    with safe_open(str(snap.path), "pt") as f:
        return _ANCHOR in (f.metadata() or {})


def _changes(target: dict[str, torch.Tensor], given: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """What one snapshot stores so that `given` (what the later ones give back, updated in place) becomes
    `target`: a matrix's rows that moved by more than ROW_TOLERANCE of their largest weight, as int8 changes
    with a float32 scale per row (and their indices when not all rows moved); any other tensor that moved, as
    it is (float16), as is one that the final weights file lacks (None in `given`)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in target.items():
        before = given[name]
        if before is None:
            out[name] = t.to(torch.float16)
            given[name] = out[name].float()
            continue
        change = t - before
        if t.dim() == 2:
            moved = change.abs().amax(dim=1)  # [rows]
            rows = (moved > ROW_TOLERANCE * t.abs().amax(dim=1).clamp(min=1e-6)).nonzero().flatten()  # [moved]
            if len(rows) == 0:
                continue
            scale = (moved[rows] / 127).clamp(min=1e-12)  # [moved rows]
            q = (change[rows] / scale[:, None]).round().clamp(-127, 127).to(torch.int8)  # [moved rows, cols]
            out[name], out[name + _SCALE] = q, scale
            if len(rows) < t.shape[0]:
                out[name + _ROWS] = rows
            before[rows] += q.float() * scale[:, None]
        elif change.abs().max() > ROW_TOLERANCE * t.abs().max().clamp(min=1e-6):
            out[name] = t.to(torch.float16)
            given[name] = out[name].float()
    return out


def _load_compacted(model: torch.nn.Module, folder: Path, chain: list[Snapshot]) -> set[str]:
    """Load the first snapshot of `chain` (a compacted one and every later one): the final weights, then
    each snapshot's changes from the last back to the first."""
    with safe_open(str(chain[0].path), "pt") as f:
        meta = f.metadata() or {}
    weights_file = folder / meta[_ANCHOR]
    if not weights_file.is_file() or _file_sha256(weights_file) != meta.get(_ANCHOR_SHA):
        raise SnapshotError(f"the snapshots are stored against the run's final weights ({meta[_ANCHOR]}), which are "
                            "missing or were replaced since: this run cannot be replayed.")
    names = json.loads(meta[_NAMES])
    params = dict(model.named_parameters())
    with safe_open(str(weights_file), "pt") as f:
        have = set(f.keys())
        values = {n: f.get_tensor(n).float() if n in have else None for n in names}
    for snap in reversed(chain):
        with safe_open(str(snap.path), "pt") as f:
            if _ANCHOR not in (f.metadata() or {}):
                raise SnapshotError(f"{snap.path.name} was not stored with the others: replay this run again "
                                    "from its own folder.")
            keys = set(f.keys())
            for name in (k for k in keys if not k.endswith((_ROWS, _SCALE))):
                t = f.get_tensor(name)
                if name + _SCALE not in keys:
                    values[name] = t.float()
                    continue
                change = t.float() * f.get_tensor(name + _SCALE)[:, None]
                if name + _ROWS in keys:
                    values[name][f.get_tensor(name + _ROWS)] += change
                else:
                    values[name] += change
    with torch.no_grad():
        for name, t in values.items():
            p = params.get(name)
            if p is None or t is None or tuple(p.shape) != tuple(t.shape):
                what = "no such parameter" if p is None else f"shape {tuple(p.shape)} here"
                raise SnapshotError(f"{chain[0].path.name} does not fit this model: {name} ({what}). "
                                    "Replay a run with the model it trained.")
            p.copy_(t.to(p.dtype))
    return set(params) - set(names)


def iter_snapshots(model: torch.nn.Module, folder: str | Path, last_first: bool = True,
                   extra: Iterable[str] = ()) -> Iterator[tuple[int, torch.nn.Module]]:
    """(step, `model`) for each snapshot in `folder`, `model` holding that snapshot's weights (loaded in
    place: pass a copy). `last_first`: the last snapshot comes first, then the others oldest first.
    `extra`: parameters of `model` that the snapshots need not hold (a head added for the replay); any
    other parameter they lack is a SnapshotError (they come from another model)."""
    snaps = list_snapshots(folder)
    if last_first and snaps:
        snaps = [snaps[-1], *snaps[:-1]]
    allowed = set(extra)
    for snap in snaps:
        untouched = load_snapshot(model, folder, snap.step) - allowed
        if untouched:
            raise SnapshotError(f"the snapshots lack {sorted(untouched)[0]}: they come from another "
                                "model.")
        yield snap.step, model


class SnapshotKeeper:
    """A training-loop callback that keeps log-spaced snapshots of the model in `folder`.

    The model is `model` (e.g. the part of a bigger module that a replay reads), else the one the loop's
    "start" event carries. A fresh run (starting at step 0)
    first clears `folder` of older snapshots; a resumed run drops only those after its step. A step that
    falls between two events is taken at the next event (steps are logged every `log_every`). Never
    raises: a snapshot that cannot be written is logged and skipped (the run matters more)."""

    def __init__(self, folder: str | Path, count: int = DEFAULT_COUNT, model: torch.nn.Module | None = None) -> None:
        self.folder = Path(folder)
        self.count = count
        self.model = model
        self.pending: list[int] = []  # target steps not reached yet
        self.saved: list[int] = []  # steps written by this keeper
        self.error: str | None = None  # why the last snapshot could not be written
        self._trainable: list[str] | None = None
        self._failed = False

    def __call__(self, event) -> None:
        try:
            self._on(event)
        except Exception as e:  # noqa: BLE001 - a replay is a nice-to-have; the run goes on
            self.error = str(e)
            log.warning("replay snapshot skipped at step %d: %s", event.step, e)

    def _on(self, event) -> None:
        if event.kind == "start":
            self.model = self.model or getattr(event, "model", None)  # the one given wins (e.g. the MLM part)
            self._clear_after(event.step)
            kept = {s.step for s in list_snapshots(self.folder)}
            self.pending = [t for t in snapshot_steps(event.total_steps, self.count) if t >= event.step
                            and t not in kept]
            self.saved, self._trainable, self._failed = [], None, False
        if event.kind == "error":
            self._failed = True  # the weights may be broken: no final snapshot
        if self.model is None or self._failed:
            return
        if self.pending and self.pending[0] <= event.step:
            self.pending = [t for t in self.pending if t > event.step]
            self._save(event.step)
        elif event.kind == "end" and event.step not in self.saved and event.step > 0:
            self._save(event.step)  # a run cancelled between two targets: keep where it stopped

    def _save(self, step: int) -> None:
        if self._trainable is None:
            self._trainable = [n for n, p in self.model.named_parameters() if p.requires_grad]
        full = [s for s in list_snapshots(self.folder) if s.full and s.step <= step]
        if not full:
            save_snapshot(self.model, self.folder, step)
        else:
            save_snapshot(self.model, self.folder, step, self._trainable, base=full[-1])
        self.saved.append(step)

    def _clear_after(self, step: int) -> None:
        """A fresh run (step 0) clears every old snapshot; a resumed one those after its step."""
        for snap in list_snapshots(self.folder):
            if snap.step > step or step == 0:
                snap.path.unlink(missing_ok=True)


def snapshot_bytes(folder: str | Path) -> int:
    """Bytes the snapshots in `folder` take on disk."""
    return sum(s.path.stat().st_size for s in list_snapshots(folder))
