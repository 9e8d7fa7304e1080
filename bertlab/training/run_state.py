"""The state of one run of a training tab (Fine-tuning, Pre-training), kept as solara keeps reactive
state: a plain dataclass. The training thread only appends events to it (`RunState.add`, thread-safe);
everything else (status, step, curves, the result) is read from those events, by the tab's view, on the
kernel's thread. No widget lives here, so a test reads a run without a browser or a widget.

    run = FinetuneRun(label="sst2 · full", config=cfg, task="sst2", mode="full", out_dir=..., base=model)
    finetune(cfg, callbacks=[run.add])     # in the background: loop events go in
    run.status, run.step, run.history      # anywhere: what the events say
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from bertlab.tasks import get_task
from bertlab.training.loop import TrainEvent
from bertlab.training.pretrain import PretrainConfig, curve_point

Level = Literal["info", "warning", "error"]
C = TypeVar("C")


@dataclass(frozen=True)
class Note:
    """A line the run says as it goes ("reading the data…"); `busy` while the work it names lasts."""

    text: str
    level: Level = "info"
    busy: bool = False


@dataclass(frozen=True)
class Outcome:
    """Something the run's work hands back (`what`: "result", "error", "dev", "probe", "saved", …)."""

    what: str
    value: Any


Event = TrainEvent | Note | Outcome


@dataclass(kw_only=True)
class RunState(Generic[C]):
    """One run: what it was asked (`config`) and, in order, everything it reported (`events`)."""

    label: str
    config: C
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, event: Event) -> None:
        """Append one event (from any thread); also the training loop's callback."""
        with self._lock:
            self.events.append(event)

    __call__ = add

    def snapshot(self) -> list[Event]:
        """The events so far (a copy: the training thread may append while the view reads)."""
        with self._lock:
            return list(self.events)

    def train_events(self) -> list[TrainEvent]:
        return [e for e in self.snapshot() if isinstance(e, TrainEvent)]

    def outcome(self, what: str, default: Any = None) -> Any:
        """The last value handed back as `what` (None/`default` before)."""
        return next((e.value for e in reversed(self.snapshot()) if isinstance(e, Outcome) and e.what == what),
                    default)

    def outcomes(self, what: str) -> list[Any]:
        return [e.value for e in self.snapshot() if isinstance(e, Outcome) and e.what == what]

    @property
    def note(self) -> Note | None:
        """The last line the run said (None before any)."""
        return next((e for e in reversed(self.snapshot()) if isinstance(e, Note)), None)

    @property
    def last_event(self) -> TrainEvent | None:
        events = self.train_events()
        return events[-1] if events else None

    @property
    def result(self) -> Any:
        """What the training function returned (a FinetuneResult, TrainResult, …), None until it did."""
        return self.outcome("result")

    @property
    def error(self) -> str | None:
        """The message of an error that stopped the run, or of its leaving the class queue (None: none)."""
        return self.outcome("error") or self.outcome("cancelled")

    @property
    def status(self) -> str:
        """starting, running, completed, cancelled or failed."""
        if self.outcome("cancelled") is not None:  # left the class queue before it ran
            return "cancelled"
        if self.error is not None:
            return "failed"
        result = self.result
        if result is not None:
            return getattr(result, "status", "completed")
        return "running" if self.train_events() else "starting"

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "cancelled", "failed")

    @property
    def step(self) -> int:
        """Optimizer steps done (the last event's count, the result's once there is one)."""
        result = self.result
        train = getattr(result, "train", result)
        if train is not None and hasattr(train, "step"):
            return train.step
        last = self.last_event
        return last.step if last is not None else 0

    @property
    def total_steps(self) -> int:
        start = next((e for e in self.train_events() if e.kind == "start"), None)
        return start.total_steps if start is not None else 0

    @property
    def precision(self) -> str | None:
        """What the loop computes in ("bf16" autocast or "fp32"), from its start event."""
        start = next((e for e in self.train_events() if e.kind == "start"), None)
        return start.precision if start is not None else None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Train and eval entries, as the loop's events give them (`TrainEvent.history_entry`)."""
        return [h for e in self.train_events() if (h := e.history_entry()) is not None]

    @property
    def checkpoint(self) -> str | None:
        return next((e.path for e in reversed(self.train_events()) if e.kind == "checkpoint"), None)


@dataclass(kw_only=True)
class FinetuneRun(RunState[Any]):
    """One fine-tuning run of the session (`config`: its FinetuneConfig)."""

    task: str
    mode: str
    out_dir: Path
    picked: Any  # the model picked when Start was pressed (a Bert)
    start: str = "picked"  # "Start from": the model picked in the app, or a start encoder's `bertlab.load` source
    features: str | None = None  # feature mode's choice of layers (tasks.layer_features.FEATURES); None = own head

    @property
    def base(self) -> Any:
        """The model the run starts from (the "before" of the [CLS] picture): the start encoder once loaded."""
        return self.outcome("base", self.picked)

    @property
    def metric(self) -> str:
        return get_task(self.task).main_metric

    @property
    def score(self) -> float | None:
        """The last dev evaluation's main metric (task scale), None before any."""
        evals = [h for h in self.history if h.get("kind") == "eval" and self.metric in h]
        return evals[-1][self.metric] if evals else None

    def percent(self, value: float) -> float:
        """The task's main metric in percent (SQuAD's F1 already is)."""
        return value if self.task == "qa" else 100 * value

    @property
    def dev(self) -> list[Any]:
        """The dev examples the run scored (handed back once the data is read)."""
        return self.outcome("dev", [])

    @property
    def summary(self) -> dict[str, Any]:
        result = self.result
        return result.summary() if result is not None and hasattr(result, "summary") else {}

    @property
    def id2label(self) -> dict[int, str]:
        model = getattr(self.result, "model", None)
        return dict(model.config.id2label) if model is not None else {}


def dev_curves(runs: Sequence[FinetuneRun]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """(dev metric name, label -> history) with every run's dev metric in percent under that name, so that
    runs of different tasks share one axis."""
    metrics = {r.metric for r in runs}
    name = f"{metrics.pop()} (%)" if len(metrics) == 1 else "main metric (%)"
    return name, {r.label: [{**h, name: r.percent(h[r.metric])} if h["kind"] == "eval" and r.metric in h else h
                            for h in r.history] for r in runs}


@dataclass(kw_only=True)
class PretrainRun(RunState[PretrainConfig]):
    """One pre-training run (`config`: its PretrainConfig); `family` names what it trains ("RoBERTa")."""

    family: str
    pair_task: str | None  # "nsp", "sop", or None: the objective has no sentence-pair task
    probe: str = ""  # the probe sentence read as it trains ("" when it has no mask)

    @property
    def points(self) -> list[dict[str, Any]]:
        """The curves' points: MLM loss and accuracy and the pair task's accuracy at each logged step."""
        return [curve_point(e) for e in self.train_events() if e.kind == "step"]

    @property
    def probe_rows(self) -> list[tuple[int, list[Any]]]:
        """(step, top guesses: analysis.mask.Candidate) each time the probe was read."""
        return self.outcomes("probe")
