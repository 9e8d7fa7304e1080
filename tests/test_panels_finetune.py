"""Fine-tuning tab without a browser: tiny runs through the panel's widgets (Start, Cancel, the
data sources), failures (out of memory, a malformed upload, a closed tab), and the "use it"
views for each kind of head. A 2-layer, 32-wide BERT with the MiniLM vocabulary trains on a
few dozen real SST-2 sentences on the CPU; every run is joined with `panel.job.wait()`."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import tiny_bert

from bertlab.analysis.predict import classify, entities
from bertlab.families.bert import Bert
from bertlab.loading import load
from bertlab.panels.data_source import save_upload
from bertlab.panels.finetune import FinetunePanel
from bertlab.tasks import CONLL_LABELS, NLI_LABELS, SST2_LABELS, get_task, read_train_dev
from bertlab.tasks.models import model_task
from bertlab.tokenizer import Tokenizer
from bertlab.training.finetune_defaults import recipe
from bertlab.training.loop import TrainEvent
from bertlab.training.run_state import FinetuneRun

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (SHARED_DATA / "sst2").is_dir(), reason="shared data folder not present")


pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


def small_panel(model: Bert, tok: Tokenizer, runs_dir: Path, made: list) -> FinetunePanel:
    """A panel set for a run of a few seconds: 64 examples, batches of 8, one epoch."""
    panel = FinetunePanel(model, tok, runs_dir=runs_dir, device="cpu")
    panel.model_made = lambda name, m, t: made.append((name, m, t))
    panel.max_train.value, panel.max_dev.value, panel.epochs.value = 64, 32, 1
    panel.batch.value, panel.max_length.value = 8, 64
    panel.lr.value = 1e-3
    return panel


def errors(panel) -> str:
    return " ".join(text for level, text in panel.messages if level == "error")


def weights(model: Bert) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# One session: full, feature and adapter runs on the same plot (SST-2 from a typed-in folder)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def session(tok, tmp_path_factory):
    if not (SHARED_DATA / "sst2").is_dir():
        pytest.skip("shared data folder not present")
    base = tiny_bert(tok)
    before = weights(base)
    made: list = []
    panel = small_panel(base, tok, tmp_path_factory.mktemp("runs"), made)
    panel.path.value = str(SHARED_DATA / "sst2")  # typing a path picks the "path" source
    for mode in ("full", "feature", "adapter"):
        panel.mode.value = mode  # sets the mode's default learning rate
        panel.start_button.click()
        assert panel.job.running and panel.start_button.disabled and not panel.cancel_button.disabled
        assert panel.job.wait(120)
    return panel, made, base, before


@needs_data
def test_a_run_draws_live_curves_and_the_model_joins_the_picker(session, tok):
    panel, made, base, before = session
    run = panel.runs[0]
    assert panel.data.value == "path" and run.label == "sst2 · full" and run.status == "completed"
    assert run.step == run.total_steps == 8  # 64 examples / batches of 8, one epoch
    loss, dev = panel.curves.data[0], panel.curves.data[1]
    assert loss.name == dev.name == "sst2 · full"
    assert list(loss.x) == list(range(1, 9)) and all(0.3 < y < 1.2 for y in loss.y)  # ~ln 2 for 2 classes
    accuracies = [h["accuracy"] for h in run.history if h["kind"] == "eval"]
    assert list(dev.x) == [2, 4, 6, 8]  # EVALS_PER_EPOCH = 4
    np.testing.assert_allclose(dev.y, [round(100 * a, 4) for a in accuracies])
    assert panel.progress.value == panel.progress.max == 8
    from bertlab.training.loop import native_bf16

    assert run.precision == ("bf16" if native_bf16(torch.device("cpu")) else "fp32")  # from the loop's start
    assert ("bf16</span>" in panel.progress_text.value) == (run.precision == "bf16")  # said where it applies
    name, model, tok2 = made[0]
    assert re.fullmatch(r"sst2 · full \(accuracy=0\.\d+\)", name) and tok2 is tok
    pred = classify(model, tok, "a wonderful film")
    assert pred.labels == ["negative", "positive"] and sum(pred.probabilities) == pytest.approx(1)
    # the picker's model was copied, never changed in place
    assert base.config.task is None
    for k, v in weights(base).items():
        torch.testing.assert_close(v, before[k])
    # the final model is saved in the run's folder and reloads with the same predictions
    reloaded, tok3 = load(run.out_dir)
    torch.testing.assert_close(classify(reloaded, tok3, "a wonderful film").probabilities, pred.probabilities)
    assert {"training curves", "confusion matrix", "class probabilities"} <= set(panel.figures())
    matrix = panel.figures()["confusion matrix"].data[0]
    assert sum(map(sum, np.asarray(matrix.text, dtype=int))) == 32  # every dev example counted once


@needs_data
def test_the_three_modes_compare_on_one_plot(session):
    panel, made, _, _ = session
    assert [r.label for r in panel.runs] == ["sst2 · full", "sst2 · feature", "sst2 · adapter"]
    assert [t.name for t in panel.curves.data] == [r.label for r in panel.runs for _ in range(2)]
    assert all(len(t.x) > 0 for t in panel.curves.data)
    assert [m[0].split(" (")[0] for m in made] == ["sst2 · full", "sst2 · feature", "sst2 · adapter"]
    trained = {r.mode: r.summary["trainable_parameters"] for r in panel.runs}
    assert trained["feature"] < trained["adapter"] < trained["full"]
    assert made[2][1].config.adapter_size == 64 and made[1][1].config.adapter_size is None
    table = panel.runs_table.value
    assert table.count("<tr>") == 4 and "sst2 · adapter" in table and "completed" in table


@needs_data
def test_use_it_follows_the_model_just_made_and_draws_cls_before_after(session):
    panel, made, base, _ = session
    use = panel.use
    assert use.model is made[-1][1] and use.kind == "sst2" and use.before is base
    assert use.view.children[0] is use.views["sst2"]
    use.sentence.value = "a dull, lifeless film"
    bars = use.probs_box.children[0].data[0]
    assert list(bars.y) == ["negative", "positive"] and sum(bars.x) == pytest.approx(1, abs=1e-3)
    use.pca_button.click()
    assert not errors(use), use.messages
    fig = use.pca_box.children[0]
    assert [a.text.split(" (")[0] for a in fig.layout.annotations] == ["before fine-tuning", "after fine-tuning"]
    points = sum(len(t.x) for t in fig.data)
    assert points == 2 * len(panel.runs[-1].dev) == 64  # the run's 32 dev examples, in both panels
    assert "[CLS] PCA" in panel.figures()
    # the app re-sends the current model when a new one joins: the use-it model stays
    panel.set_model(base, panel.tok)
    assert use.model is made[-1][1]


# ---------------------------------------------------------------------------------------------
# Cancel, out of memory, a closed tab, malformed data
# ---------------------------------------------------------------------------------------------
def test_cancel_mid_run_keeps_a_usable_checkpoint_and_model(tok, tmp_path, shared_data, monkeypatch):
    made: list = []
    panel = small_panel(tiny_bert(tok), tok, tmp_path / "runs", made)
    assert panel.data.value == "default"  # BERTLAB_DATA
    real = FinetuneRun.add

    def cancel_at_3(run, event):  # the training thread reports step 3: Cancel (the job's cancel is thread-safe)
        real(run, event)
        if isinstance(event, TrainEvent) and event.kind == "step" and event.step >= 3:
            panel.job.cancel()

    monkeypatch.setattr(FinetuneRun, "add", cancel_at_3)
    panel.start_button.click()
    panel.start_button.click()  # a second Start while running is refused with a message
    assert "in progress" in errors(panel) and len(panel.runs) == 1
    assert panel.job.wait(120)
    run = panel.runs[0]
    assert run.status == "cancelled" and run.step == 3
    assert not panel.start_button.disabled and panel.cancel_button.disabled
    name, model, _ = made[0]
    assert "cancelled at step 3" in name
    checkpoint = Path(run.summary["saved_to"])
    assert checkpoint.name == "checkpoint-3" and checkpoint.parent.parent == run.out_dir
    reloaded, tok2 = load(checkpoint)
    torch.testing.assert_close(classify(reloaded, tok2, "so boring").probabilities,
                               classify(model, tok, "so boring").probabilities)
    assert "cancelled at step 3" in " ".join(t for _, t in panel.messages)
    assert list(panel.curves.data[0].x) == [1, 2, 3]  # the partial curve stays on the plot


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory"),
])
def test_out_of_memory_says_what_to_change(tok, tmp_path, shared_data, monkeypatch, error):
    def no_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr("bertlab.panels.finetune.finetune", no_memory)
    made: list = []
    panel = small_panel(tiny_bert(tok), tok, tmp_path, made)
    panel.batch.value, panel.max_length.value = 32, 128
    panel.start_button.click()
    assert panel.job.wait(30)
    text = errors(panel)
    assert "Out of GPU memory with batches of 32 × up to 128 tokens" in text
    assert "smaller batch (e.g. 16)" in text and "shorter sequences (max length 64)" in text
    assert not panel.runs and not made and not panel.start_button.disabled  # it never started: no row


def test_out_of_memory_inside_the_loop_gives_the_same_advice(tok, tmp_path, shared_data, monkeypatch):
    """The loop catches an OOM itself and returns a failed result: the panel still explains it."""
    import bertlab.training.finetune as ft

    real = ft.LOSSES["sequence_classification"]

    def oom_at_step_2(model, batch, calls=[]):  # noqa: B006 - counts calls
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(model, batch)

    monkeypatch.setitem(ft.LOSSES, "sequence_classification", oom_at_step_2)
    made: list = []
    panel = small_panel(tiny_bert(tok), tok, tmp_path, made)
    panel.start_button.click()
    assert panel.job.wait(60)
    assert "Out of GPU memory with batches of 8" in errors(panel) and not made
    assert panel.runs[0].status == "failed" and panel.runs[0].step == 1


def close_all(widget) -> None:
    for child in getattr(widget, "children", ()):
        close_all(child)
    widget.close()


def test_a_closed_tab_does_not_lose_the_run(tok, tmp_path, shared_data):
    made: list = []
    panel = small_panel(tiny_bert(tok), tok, tmp_path, made)
    panel.max_train.value = 16
    panel.start_button.click()
    close_all(panel.widget)  # the student closed the tab: the kernel and the thread go on
    assert panel.job.wait(120)
    run = panel.runs[0]
    assert run.status == "completed" and (run.out_dir / "model.safetensors").is_file()
    assert made and not errors(panel)


def upload(panel, name: str, content: bytes) -> None:
    panel.upload.value = ({"name": name, "type": "text/tab-separated-values", "size": len(content),
                           "content": memoryview(content), "last_modified": datetime.datetime.now()},)


def test_a_malformed_upload_names_the_line(tok, tmp_path):
    panel = small_panel(tiny_bert(tok), tok, tmp_path, [])
    upload(panel, "my reviews.tsv", b"sentence\tlabel\ngood film\t1\nbad\tfilm\t0\n")
    text = errors(panel)
    assert text.startswith("my reviews.tsv line 3: expected 2 tab-separated fields"), text
    assert "bertlab-upload" not in text  # the student's file name, not the temporary path
    assert panel.data.value == "upload"
    panel.start_button.click()  # Start reads it again: the same message, no crash
    assert panel.job.wait(30) and "line 3" in errors(panel) and not panel.runs  # a failed start adds no row
    good = "".join(f"{w} film {i}\t{i % 2}\n" for i, w in enumerate(["dull", "great"] * 10)).encode()
    upload(panel, "my reviews.tsv", good)
    assert not errors(panel)
    assert "my reviews.tsv: 18 training examples, 2 held out as dev" in panel.messages[0][1]


def test_an_upload_is_saved_inside_its_folder_whatever_its_name(tmp_path):
    for name in ("../../evil.tsv", "/etc/passwd", "..", ""):
        path = save_upload({"name": name, "content": memoryview(b"x\t1\n")}, tmp_path)
        assert path.parent == tmp_path and path.read_bytes() == b"x\t1\n"


def test_the_next_run_trains_a_copy_of_the_model_picked_last(tok, tmp_path, shared_data, monkeypatch):
    seen = []

    def fake_finetune(cfg, **kwargs):
        seen.append(cfg)
        raise ValueError("stopped by the test")

    monkeypatch.setattr("bertlab.panels.finetune.finetune", fake_finetune)
    panel = small_panel(tiny_bert(tok), tok, tmp_path, [])
    other = tiny_bert(tok, seed=3)
    panel.set_model(other, tok)
    panel.task.value, panel.mode.value = "nli", "adapter"  # the task's and mode's defaults
    assert panel.start_from.options == (("the model picked above", "picked"),)  # not the offline default
    panel.batch.value = 8
    panel.start_button.click()
    assert panel.job.wait(30)
    cfg = seen[0]
    r = recipe("nli", "adapter")
    assert cfg.model is other and (cfg.task, cfg.mode, cfg.lr, cfg.batch_size) == ("nli", "adapter", r.lr, 8)
    assert (cfg.epochs, cfg.max_length) == (r.epochs, r.max_length)
    assert (cfg.max_train_examples, cfg.max_eval_examples, cfg.device) == (64, 32, "cpu")
    assert cfg.eval_every == 2 and cfg.checkpoint_every == 8  # 4 evaluations and 1 checkpoint an epoch
    assert Path(cfg.out_dir).parent == tmp_path and not panel.runs  # it never started: no row
    assert "stopped by the test" in errors(panel)


def test_a_missing_path_is_a_message(tok, tmp_path):
    panel = small_panel(tiny_bert(tok), tok, tmp_path, [])
    panel.data.value = "path"
    panel.start_button.click()
    assert "Type the path" in errors(panel) and not panel.runs
    panel.path.value = str(tmp_path / "nowhere")
    panel.start_button.click()
    assert panel.job.wait(30) and "does not exist" in errors(panel)


# ---------------------------------------------------------------------------------------------
# Data sources (pure)
# ---------------------------------------------------------------------------------------------
def test_read_examples_holds_out_dev_from_a_single_file(tmp_path):
    sst2 = tmp_path / "reviews.tsv"
    sst2.write_text("".join(f"film {i}\t{i % 2}\n" for i in range(30)), encoding="utf-8")
    split = read_train_dev(get_task("sst2"), sst2)
    assert (len(split.train), len(split.dev)) == (27, 3)
    assert {e.text_a for e in split.train}.isdisjoint(e.text_a for e in split.dev)
    assert read_train_dev(get_task("sst2"), sst2).dev == split.dev  # seeded
    sick = tmp_path / "pairs.txt"
    rows = ["pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set"]
    labels = ("ENTAILMENT", "NEUTRAL")
    rows += [f"{i}\tA man plays\tA man {i} plays\t{labels[i % 2]}\t{'TRIAL' if i < 4 else 'TRAIN'}" for i in range(20)]
    sick.write_text("\n".join(rows) + "\n", encoding="utf-8")
    split = read_train_dev(get_task("nli"), sick)
    assert (len(split.train), len(split.dev)) == (16, 4) and "TRIAL" in split.note


@needs_data
def test_read_examples_from_bertlab_data_uses_its_dev_split(shared_data):
    split = read_train_dev(get_task("nli"))
    assert (len(split.train), len(split.dev)) == (4439, 495)


# ---------------------------------------------------------------------------------------------
# "Use it" for each kind of head
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def heads(tok) -> dict[str, Bert]:
    base = tiny_bert(tok, seed=1)
    return {
        "sst2": base.with_heads(task="sequence_classification", id2label=SST2_LABELS),
        "nli": base.with_heads(task="sequence_classification", id2label=NLI_LABELS),
        "ner": base.with_heads(task="token_classification", id2label=CONLL_LABELS),
        "qa": base.with_heads(task="question_answering"),
    }


def test_the_panel_opens_on_a_model_without_a_task_head(default_model, tmp_path):
    model, tok = default_model
    panel = FinetunePanel(model, tok, runs_dir=tmp_path, device="cpu")
    assert panel.use.model is None and "Fine-tune a model above" in panel.use.header.value
    assert panel.use.pca_button.disabled and panel.figures() == {}
    assert panel.max_train.value == 2000 and "cpu" in panel.device_note.value
    assert len(panel.curves.data) == 0  # an empty plot with a hint until the first run
    panel.mode.value = "adapter"
    assert panel.lr.value == pytest.approx(recipe(panel.task.value, "adapter").lr)
    panel.task.value = "qa"
    assert panel.max_length.value == 384


def test_use_it_sentiment_and_entailment(heads, tok, tmp_path):
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path, device="cpu")
    panel.set_model(heads["sst2"], tok)
    use = panel.use
    assert use.kind == "sst2" and panel.model is heads["sst2"]
    bars = use.probs_box.children[0].data[0]  # drawn at once with the default sentence
    expected = classify(heads["sst2"], tok, use.sentence.value).probabilities
    np.testing.assert_allclose(bars.x, np.round(expected, 4))
    panel.set_model(heads["nli"], tok)
    assert use.kind == "nli" and use.view.children[0] is use.views["nli"]
    bars = use.probs_box.children[0].data[0]
    assert list(bars.y) == ["entailment", "neutral", "contradiction"]
    use.hypothesis.value = "   "
    assert "hypothesis (sentence B) is empty" in errors(use)
    assert model_task(heads["nli"]) == "nli" and model_task(tiny_bert(tok)) is None


def test_use_it_entities_and_answer_spans(heads, tok, tmp_path):
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path, device="cpu")
    panel.set_model(heads["ner"], tok)
    use = panel.use
    found = entities(heads["ner"], tok, use.ner_text.value)
    assert use.kind == "ner" and len(re.findall(r'<mark title="[A-Z]+ \(\d+%\)"', use.entities_out.value)) == len(found)
    assert ">PER</mark>" in use.entities_out.value  # the legend of entity types
    use.ner_text.value = "Tom 🙂 visited 東京"
    assert "[UNK]" in " ".join(t for _, t in use.messages) and not errors(use)
    panel.set_model(heads["qa"], tok)
    assert use.kind == "qa" and "<b>Q:</b> Who designed the Eiffel Tower?" in use.answer_out.value
    spans = use.spans_box.children[0]
    assert len(spans.data) == 2  # start and end probabilities over the paragraph's tokens
    assert sum(spans.data[0].y) == pytest.approx(1, abs=0.01)
    assert use.top_spans.value.count("<tr>") == 1 + 5
    use.top_k.value = 2
    assert use.top_spans.value.count("<tr>") == 1 + 2
    assert set(panel.figures()) == {"answer span probabilities"}
    use.pca_button.click()
    assert "sentence classification" in errors(use)  # NER/QA read every token, not [CLS]


def test_use_it_input_problems_are_messages(heads, tok, tmp_path):
    panel = FinetunePanel(heads["sst2"], tok, runs_dir=tmp_path, device="cpu")
    use = panel.use
    assert use.kind == "sst2" and not errors(use)  # a picked fine-tuned model is ready on open
    use.sentence.value = ""
    assert "empty" in errors(use)
    use.sentence.value = " ".join(["word"] * 600)
    assert any(level == "warning" and "cut" in text.lower() for level, text in use.messages), use.messages
    use.sentence.value = "[MASK]"
    assert not errors(use)


def test_cls_picture_of_a_picked_model_reads_dev_from_the_data_source(heads, tok, tmp_path, shared_data):
    panel = FinetunePanel(heads["sst2"], tok, runs_dir=tmp_path, device="cpu")
    panel.use.pca_button.click()  # no run here, so no "before": one panel of 200 dev sentences
    fig = panel.use.pca_box.children[0]
    assert not errors(panel.use) and fig.layout.annotations[0].text.startswith("this model")
    assert sum(len(t.x) for t in fig.data) == 200 and {t.name for t in fig.data} == {"negative", "positive"}


# ---------------------------------------------------------------------------------------------
# failed starts, stale errors, odd text, controls that do not apply
# ---------------------------------------------------------------------------------------------
def test_a_failed_start_adds_no_row_no_run_number_and_no_empty_axes(tok, tmp_path):
    panel = small_panel(tiny_bert(tok), tok, tmp_path, [])
    panel.path.value = str(tmp_path / "nowhere")
    for _ in range(2):
        panel.start_button.click()
        assert panel.job.wait(30) and "does not exist" in errors(panel)
    assert panel.runs == [] and panel.runs_table.value == ""  # no "failed 0/?" rows
    assert list(tmp_path.iterdir()) == []  # and no empty run folder
    assert len(panel.curves.data) == 0 and "Fine-tune a model" in panel.curves.layout.annotations[0].text
    assert panel._label("sst2", "full") == "sst2 · full"  # the next run is not "#3"
    assert panel.figures() == {}
    panel.task.value = "nli"  # the error was about the previous task's data
    assert panel.messages == [] and panel.message.value == ""


def test_use_it_shows_sentence_b_only_where_it_applies(heads, tok, tmp_path):
    panel = FinetunePanel(heads["sst2"], tok, runs_dir=tmp_path, device="cpu")
    use = panel.use
    assert use.kind == "sst2" and use.sentence_b not in use.views["sst2"].children
    use.sentence_b.value = "a second sentence the student cannot see"
    expected = classify(heads["sst2"], tok, use.sentence.value).probabilities
    np.testing.assert_allclose(use.probs_box.children[0].data[0].x, np.round(expected, 4))
    generic = tiny_bert(tok, seed=1).with_heads(task="sequence_classification", id2label={0: "a", 1: "b", 2: "c"})
    panel.set_model(generic, tok)
    assert use.kind == "classification" and use.sentence_b in use.view.children[0].children


@pytest.mark.parametrize("text, words", [
    ("\u200b\u200b\x07", "only invisible characters"),
    ("good \ud800 film", "broken character"),
])
def test_use_it_refuses_text_it_cannot_read_with_a_clear_message(heads, tok, tmp_path, text, words):
    panel = FinetunePanel(heads["sst2"], tok, runs_dir=tmp_path, device="cpu")
    use = panel.use
    use.sentence.value = text
    assert words in errors(use) and "Something went wrong" not in errors(use)


def test_the_offline_default_fine_tunes_from_each_tasks_start_encoder(default_model, tmp_path, shared_data,
                                                                       monkeypatch):
    """Picked: the offline default. "Start from" offers the task's start encoder (the package's, as it ships)
    and a run fine-tunes a copy of that, unless the student picks "the model picked above"."""
    model, tok = default_model
    seen = []

    def fake_finetune(cfg, **kwargs):
        seen.append(cfg)
        raise ValueError("stopped by the test")

    monkeypatch.setattr("bertlab.panels.finetune.finetune", fake_finetune)
    panel = FinetunePanel(model, tok, runs_dir=tmp_path, device="cpu")
    panel.task.value = "nli"
    r = recipe("nli")
    assert panel.start_from.value == r.model == "default-encoder"
    assert "package ships" in panel.start_note.value and "offline default" in panel.start_note.value
    assert (panel.epochs.value, panel.lr.value, panel.batch.value) == (r.epochs, r.lr, r.batch_size)
    panel.max_train.value, panel.max_dev.value = 16, 8
    panel.start_button.click()
    assert panel.job.wait(60)
    start = seen[0].model
    assert start is not model and start.load_report.source == "default-encoder"
    assert start.config.task is None and not start.config.pretraining_heads  # the encoder alone
    layer = "bert.encoder.layer.5.output.dense.weight"
    assert not torch.equal(start.state_dict()[layer], model.state_dict()[layer])  # not the re-trained layers
    panel.start_from.value = "picked"
    assert "default for nli starts from" in panel.start_note.value
    panel.start_button.click()
    assert panel.job.wait(60)
    assert seen[1].model is model
    panel.set_model(tiny_bert(tok), tok)  # another model: only "the model picked above"
    assert [v for _, v in panel.start_from.options] == ["picked"]
