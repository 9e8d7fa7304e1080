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
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
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
        based_on = (f.metadata() or {}).get(_BASE)
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
