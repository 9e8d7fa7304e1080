"""The run tabs keep a run in a plain dataclass (training/run_state.py) that the training thread only
appends events to; the tab draws from it on the kernel's thread. The state reads without a widget, and a
real Fine-tuning and Pre-training run write no widget from any thread but the one that pressed Start."""

from __future__ import annotations

import threading
from pathlib import Path

import ipywidgets as widgets
import pytest
from tiny_models import tiny_bert

from bertlab.panels.finetune import FinetunePanel
from bertlab.panels.pretrain import PretrainPanel
from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import FALLBACK_DOCUMENTS
from bertlab.training.loop import TrainEvent, TrainResult
from bertlab.training.pretrain import PretrainConfig, new_model
from bertlab.training.run_state import FinetuneRun, Note, Outcome, PretrainRun, dev_curves
from bertlab.viz import pretrain_words

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the state alone --------------------------------------------------------------------------------
def test_a_finetune_run_reads_its_status_steps_and_curves_from_its_events():
    run = FinetuneRun(label="sst2 · full", config=None, task="sst2", mode="full", out_dir=Path("x"), picked="model")
    assert (run.status, run.step, run.total_steps, run.history, run.score) == ("starting", 0, 0, [], None)
    run.add(Note("sst2 · full: reading the data…", busy=True))
    run.add(Outcome("dev", ["a", "b"]))
    run.add(TrainEvent("start", 0, 4, 0.0, precision="fp32"))
    for step in (1, 2):
        run.add(TrainEvent("step", step, 4, step / 4, loss=0.7 - step / 10))
    run.add(TrainEvent("eval", 2, 4, 0.5, metrics={"accuracy": 0.75, "confusion_matrix": [[1]]}))
    assert (run.status, run.step, run.total_steps, run.precision, run.dev) == ("running", 2, 4, "fp32", ["a", "b"])
    assert [h["kind"] for h in run.history] == ["train", "train", "eval"] and run.score == 0.75
    assert run.note.busy and run.base == "model"
    metric, curves = dev_curves([run])
    assert metric == "accuracy (%)" and curves["sst2 · full"][-1]["accuracy (%)"] == 75.0
    run.add(Outcome("result", TrainResult("cancelled", 3, 4)))
    assert (run.status, run.step, run.ended) == ("cancelled", 3, True)
    run.add(Outcome("error", "out of memory"))
    assert run.status == "failed" and run.error == "out of memory"


def test_events_append_from_many_threads_without_loss():
    run = FinetuneRun(label="r", config=None, task="sst2", mode="full", out_dir=Path("x"), picked=None)

    def add_many() -> None:
        for step in range(500):
            run.add(TrainEvent("step", step, 500, 0.0, loss=1.0))

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(run.snapshot()) == 2000 and len(run.history) == 2000


@pytest.mark.parametrize("objective, family, pair", [(None, "BERT", "nsp"), ("roberta", "RoBERTa", None),
                                                     ("albert", "ALBERT", "sop"), ("electra", "ELECTRA", None)])
def test_a_pretraining_run_is_named_from_its_objective(objective, family, pair):
    cfg = PretrainConfig(size="tiny", corpus="c", steps=4, objective=objective)
    assert pretrain_words.family(cfg) == family and pretrain_words.pair_task(cfg) == pair
    assert pretrain_words.run_label(cfg) == f"mini {family} (tiny)"
    assert pretrain_words.replay_label(cfg, 8, 1).startswith(f"mini {family} (tiny)")
    run = PretrainRun(label=pretrain_words.run_label(cfg), config=cfg, family=family, pair_task=pair)
    run.add(TrainEvent("step", 1, 4, 0.0, metrics={"mlm_loss": 5.0, "mlm_acc": 0.1}))
    run.add(Outcome("probe", (1, ["the"])))
    assert run.points == [{"step": 1, "mlm_loss": 5.0, "mlm_acc": 0.1, "nsp_acc": None}]
    assert run.probe_rows == [(1, ["the"])]


# -- no widget written from the training thread ------------------------------------------------------
@pytest.fixture
def widget_writes(monkeypatch):
    """Every widget opened or changed off the main thread, as 'thread: widget.trait'."""
    seen: list[str] = []
    real_notify, real_open = widgets.Widget.notify_change, widgets.Widget.open

    def off_main(what: str) -> None:
        if threading.current_thread() is not threading.main_thread():
            seen.append(f"{threading.current_thread().name}: {what}")

    def notify_change(self, change):
        off_main(f"{type(self).__name__}.{change['name']}")
        return real_notify(self, change)

    def open_(self):
        off_main(f"new {type(self).__name__}")
        return real_open(self)

    monkeypatch.setattr(widgets.Widget, "notify_change", notify_change)
    monkeypatch.setattr(widgets.Widget, "open", open_)
    return seen


def test_the_guard_sees_a_widget_written_from_another_thread(widget_writes):
    label = widgets.HTML()
    t = threading.Thread(target=lambda: setattr(label, "value", "from a thread"), name="some-thread")
    t.start()
    t.join()
    assert widget_writes == ["some-thread: HTML.value"]


def test_a_finetuning_run_writes_no_widget_from_the_training_thread(tok, tmp_path, shared_data, widget_writes):
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path, device="cpu")
    made: list = []
    panel.model_made = lambda name, m, t: made.append(name)
    panel.max_train.value, panel.max_dev.value, panel.epochs.value = 32, 16, 1
    panel.batch.value, panel.max_length.value = 8, 32
    panel.start_button.click()
    assert panel.job.wait(120)
    run = panel.runs[0]
    assert run.status == "completed" and made and run.outcome("change") is not None
    assert panel.replay.runs and panel.changed.changes  # Replay and What changed were drawn, on this thread
    assert not widget_writes, widget_writes


def test_a_pretraining_run_writes_no_widget_from_the_training_thread(tmp_path, widget_writes):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "a", "saw", "near", "cat", "dog", "bird",
             "fish", "tree", "house", "river", "road"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = Tokenizer.from_folder(tmp_path)
    words = vocab[10:]
    docs = [" ".join(f"The {words[(d + s) % 8]} saw a {words[(d + 2 * s) % 8]} near the {words[(d * s) % 8]}."
                     for s in range(8)) for d in range(20)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs), encoding="utf-8")
    p = PretrainPanel(new_model("tiny", tok), tok, text="the cat saw a dog .", probe="the cat saw a [MASK] .",
                      pair_documents=FALLBACK_DOCUMENTS)
    p.runs_dir = tmp_path / "runs"
    p.corpus_path.value = str(tmp_path / "corpus.txt")
    p.objective.value = "roberta"
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value, p.probe_every.value = "tiny", 4, 4, 32, 2
    made: list = []
    p.model_made = lambda name, m, t: made.append(name)
    p.start.click()
    assert p.job.wait(120)
    assert p.result.status == "completed" and made == ["mini RoBERTa (tiny, 4 steps)"], p.run_messages
    assert p.probe_rows and p.replay.runs and list(p.replay.runs)[0].startswith("mini RoBERTa (tiny)")
    assert p.curves.layout.title.text.startswith("mini RoBERTa (tiny): finished")
    assert any("no NSP / SOP: RoBERTa" in a.text for a in p.curves.layout.annotations)  # why that chart is empty
    assert not widget_writes, widget_writes
