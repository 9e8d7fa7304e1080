"""The training tabs, without a browser: a pre-training run and fine-tuning runs
keep snapshots, the Replay section's slider shows each view at each step, and "What changed" compares the
session's runs (a frozen encoder changes nothing). Tiny models; the fine-tuning runs read SST-2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import tiny_bert

from bertlab.analysis.mask import fill_mask
from bertlab.panels.finetune import FinetunePanel
from bertlab.panels.pretrain import FALLBACK_DOCUMENTS, PretrainPanel
from bertlab.panels.replay import ReplaySection
from bertlab.tokenizer import Tokenizer
from bertlab.training.pretrain import new_model
from bertlab.training.snapshots import REPLAY_DIR, list_snapshots, load_snapshot

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "cat dog bird fish tree house river road car boat city park garden school market farm".split()


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("vocab")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "a", "saw", "near", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def pretrained(small_tok, tmp_path_factory):
    """A Pre-training tab after one 12-step run on a small corpus."""
    root = tmp_path_factory.mktemp("pretrain")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(f"The {WORDS[(d + s) % 16]} saw a {WORDS[(3 * d + s) % 16]} near the "
                                           f"{WORDS[(d * s + 5) % 16]}." for s in range(6)) for d in range(20)),
                      encoding="utf-8")
    p = PretrainPanel(new_model("tiny", small_tok), small_tok, text="the cat saw a dog .",
                      probe="the cat saw a [MASK] .", pair_documents=FALLBACK_DOCUMENTS)
    p.runs_dir = root / "runs"
    p.corpus_path.value = str(corpus)
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value = "tiny", 12, 4, 32
    p.made = []
    p.model_made = lambda name, model, tok: p.made.append((name, model, tok))
    p.start.click()
    assert p.job.wait(120) and p.result.status == "completed", p.run_messages
    return p


def test_a_pretraining_run_is_replayed_step_by_step(pretrained, small_tok):
    p = pretrained
    replay = p.replay
    (label,) = replay.runs
    folder = replay.runs[label].folder
    assert folder.parent.parent == p.runs_dir and folder.name == REPLAY_DIR  # in the run's own folder
    steps = [s.step for s in list_snapshots(folder)]
    assert steps[0] == 0 and steps[-1] == 12 and len(steps) >= 5
    assert [v for _, v in replay.step.options] == steps == replay.result.steps
    assert replay.step.value == 12 and not replay.step.disabled and replay.messages == []
    _, model, _ = p.made[0]
    # every step shows that snapshot's guesses: a copy of the model loaded with it predicts the same
    for step in (steps[0], steps[2], steps[-1]):
        replay.step.value = step
        bars = replay.view_box.children[0].data[0]
        assert replay.view_box.children[0].layout.title.text.startswith(f"step {step}")
        reference = new_model("tiny", small_tok)
        load_snapshot(reference, folder, step)
        want = fill_mask(reference, small_tok, "the cat saw a [MASK] .", k=5)[0].candidates
        assert list(bars.y) == [c.token for c in want]
        traj = replay.trajectory_box.children[0]
        assert traj.layout.shapes[0].x0 == steps.index(step)  # the marker follows the slider
    assert len(replay.trajectory_box.children[0].data) == 3  # the three words followed
    torch.testing.assert_close(  # the final snapshot is the model that joined the picker (up to fp16)
        replay.result.frame(12).attention.patterns,
        __import__("bertlab.analysis.attention", fromlist=["x"]).attention_patterns(
            model, small_tok, "the cat saw a [MASK] .").patterns, atol=3e-3, rtol=0)


@pytest.mark.parametrize("view, trace", [("Attention", "heatmap"), ("Embeddings", "heatmap"),
                                         ("Logit lens", "heatmap"), ("Mask", "bar")])
def test_each_view_draws_every_step(pretrained, view, trace):
    replay = pretrained.replay
    replay.view.value = view
    shown = {"Attention": (replay.layer, replay.head), "Embeddings": (replay.stage,)}.get(view, ())
    assert all(w.layout.display == "" for w in shown)
    if view == "Attention":
        replay.layer.value, replay.head.value = 1, 1
    for step in replay.result.steps:
        replay.step.value = step
        fig = replay.view_box.children[0]
        assert fig.data[0].type == trace and fig.layout.title.text.startswith(f"step {step}")
    if view != "Attention":  # a new kind of figure: nothing of the heatmap before it stays (axes, ticks)
        assert "attended" not in str(replay.view_box.children[0].layout.xaxis.title.text)
    if view == "Attention":
        z = replay.view_box.children[0].data[0].z
        want = replay.result.frame(replay.result.steps[-1]).attention.patterns[1, 1].numpy()
        assert abs(float(z[0][0]) - float(want[0, 0])) < 1e-3
    assert {"replay: over training", "replay: view"} <= set(pretrained.figures())


def test_a_bad_probe_is_a_message_and_clears_the_views(pretrained):
    replay = pretrained.replay
    replay.probe.value = "   "
    assert replay.messages and replay.messages[-1][0] == "error"
    assert replay.view_box.children == () and replay.trajectory_box.children == ()
    replay.probe.value = "the dog saw a [MASK] ."
    assert replay.messages == [] and replay.view_box.children


def test_a_replay_section_without_runs_says_what_to_do(small_tok):
    s = ReplaySection(small_tok, "the [MASK] .")
    assert s.replay_button.disabled and s.step.disabled and s.figures() == {}
    s.add_run("nothing", new_model("tiny", small_tok), small_tok, Path("/nonexistent/replay"))
    assert "kept no snapshots" in s.messages[-1][1] and s.runs == {}


@pytest.mark.skipif(not (SHARED_DATA / "sst2").is_dir(), reason="shared data folder not present")
def test_finetuning_runs_are_replayed_and_compared(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTLAB_DATA", str(SHARED_DATA))
    base = tiny_bert(tok)
    panel = FinetunePanel(base, tok, runs_dir=tmp_path, device="cpu")
    panel.path.value = str(SHARED_DATA / "sst2")
    for mode in ("full", "feature"):
        panel.mode.value = mode
        panel.start_from.value = "picked"
        panel.max_train.value, panel.max_dev.value, panel.epochs.value = 64, 32, 1
        panel.batch.value, panel.max_length.value, panel.lr.value = 8, 64, 1e-3
        panel.start_button.click()
        assert panel.job.wait(120)
    assert [r.status for r in panel.runs] == ["completed", "completed"], panel.messages
    # Replay: both runs, the last one shown; no MLM head anywhere, so the Mask view shows the classifier
    assert list(panel.replay.runs) == ["sst2 · full", "sst2 · feature"] and panel.replay.run.value == "sst2 · feature"
    assert all(list_snapshots(r.out_dir / REPLAY_DIR) for r in panel.runs)
    panel.replay.run.value = "sst2 · full"
    result = panel.replay.result
    assert result.steps[0] == 0 and result.steps[-1] == 8 and result.frames[-1].classes.labels == [
        "negative", "positive"]
    panel.replay.view.value = "Mask"
    assert list(panel.replay.view_box.children[0].data[0].y) == ["negative", "positive"]
    assert "no MLM head" in " ".join(t for _, t in panel.replay.messages)
    # What changed: the frozen encoder did not move at all; full fine-tuning did
    changes = panel.changed.changes
    assert list(changes) == ["sst2 · full", "sst2 · feature"]
    frozen, full = changes["sst2 · feature"].diff, changes["sst2 · full"].diff
    assert float(frozen.attention_jsd.abs().max()) == 0.0
    torch.testing.assert_close(frozen.cka, torch.ones_like(frozen.cka), atol=1e-6, rtol=0)
    assert float(full.attention_jsd.max()) > 0 and float(full.cka[-1]) < 1 - 1e-6
    for change in changes.values():
        assert change.landscape is not None and len(change.landscape.alphas) == 9
    att = panel.changed.attention_box.children[0]
    assert [t.type for t in att.data] == ["heatmap", "heatmap"]
    assert {"attention change", "representation change", "loss slices"} <= set(panel.figures())


def test_a_fine_tuned_run_is_read_through_its_bases_mlm_head(small_tok, tmp_path):
    """The Replay section borrows the base model's MLM head for a classifier's snapshots: the Mask view
    shows word guesses, and step 0 (the base's own encoder) guesses exactly as the base does."""
    from bertlab.training.snapshots import save_snapshot

    base = new_model("tiny", small_tok)
    tuned = base.with_heads((), "sequence_classification", {0: "negative", 1: "positive"})
    save_snapshot(tuned, tmp_path, 0)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_snapshot(tuned, tmp_path, 5)
    s = ReplaySection(small_tok, "the cat saw a [MASK] .")
    s.add_run("sst2 · full", tuned, small_tok, tmp_path, base=base)
    assert s.result is not None and "MLM head of the model the run started from" in s.messages[-1][1]
    s.step.value = 0
    bars = s.view_box.children[0].data[0]
    assert list(bars.y) == [c.token for c in fill_mask(base, small_tok, "the cat saw a [MASK] .", k=5)[0].candidates]
    s.view.value = "Logit lens"
    assert s.view_box.children[0].data[0].type == "heatmap"


def test_a_chosen_view_is_built_for_every_step_in_the_background(pretrained, monkeypatch):
    """After a view is chosen its figures for all steps get built off the slider's path: once they are, a
    slider move builds nothing."""
    import time

    import bertlab.panels.replay as replay_module

    replay = pretrained.replay
    replay.view.value = "Embeddings"
    replay.stage.value = 1  # a selection nothing has drawn yet
    steps = replay.result.steps
    wanted = {(id(replay.result), s, "Embeddings", 0, 0, 1) for s in steps}
    deadline = time.monotonic() + 30
    while not wanted <= set(replay._figure_cache) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wanted <= set(replay._figure_cache)

    def no_building(*args, **kwargs):
        raise AssertionError("the slider built a figure that was ready")

    monkeypatch.setattr(replay_module, "plot_frame", no_building)
    for step in steps:
        replay.step.value = step
        assert replay.view_box.children[0].layout.title.text.startswith(f"step {step}:")
    assert replay.messages == []


def test_the_class_questions_answer_is_held_back_until_the_reveal(pretrained, tmp_path):
    from bertlab.classroom.store import ClassStore, Question
    from bertlab.panels.classroom import HELD_NOTE, AnswerHold

    replay = pretrained.replay
    store = ClassStore(tmp_path / "class.sqlite")
    question = store.push(Question("mask", "the cat saw a [MASK] .", model=[("dog", 0.5)]))
    replay.answer_hold = AnswerHold(store.path)  # as `bertlab serve --class` gives the kernel
    replay.probe.value = "The cat saw a [MASK]."  # the question's sentence
    assert replay.messages == [("info", HELD_NOTE)] and replay.view_box.children == ()
    store.reveal(question.id)
    replay.probe.value = "the cat saw a [MASK] ."
    assert replay.messages == [] and replay.view_box.children
