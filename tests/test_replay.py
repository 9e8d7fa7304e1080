"""Training replayed. Snapshots kept by the loop (log-spaced, weights only, fp16, frozen
weights stored once), read back into the right model, and the probe replayed through them; the loop's own
checkpoints (resume, pruning, atomic saves) are untouched. Tiny models on a 40-word vocabulary."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from bertlab.analysis.attention import attention_patterns
from bertlab.analysis.mask import fill_mask
from bertlab.analysis.replay import replay, with_borrowed_mlm
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import latest_checkpoint, list_checkpoints
from bertlab.training.corpora import Document
from bertlab.training.loop import TrainConfig, train
from bertlab.training.pretrain import PretrainConfig, mlm_nsp_loss, pretrain
from bertlab.training.snapshots import (
    SnapshotError,
    SnapshotKeeper,
    iter_snapshots,
    list_snapshots,
    load_snapshot,
    save_snapshot,
    snapshot_steps,
)

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "cat dog bird fish tree house river road car boat city park garden school market farm".split()
PROBE = "the cat saw a [MASK] near the river ."


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("vocab")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "a", "saw", "near", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)


def documents(n: int = 12) -> list[Document]:
    return [Document([f"The {WORDS[(d + s) % 16]} saw a {WORDS[(3 * d + 5 * s) % 16]} near the "
                      f"{WORDS[(d * s + 7) % 16]}." for s in range(6)]) for d in range(n)]


def tiny(tok: Tokenizer, seed: int, heads: tuple[str, ...] = ("mlm",)) -> Bert:
    torch.manual_seed(seed)
    return Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, pretraining_heads=heads))


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class Capture:
    """A loop callback that copies the weights at every event, by step."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, event) -> None:
        if event.kind == "start":
            self.model = event.model
        self.at[event.step] = params(self.model)


def test_snapshot_steps_are_log_spaced():
    steps = snapshot_steps(1000, 8)
    assert steps[0] == 0 and steps[-1] == 1000 and len(steps) == 8 and steps == sorted(set(steps))
    gaps = [b - a for a, b in zip(steps[1:], steps[2:])]
    assert gaps == sorted(gaps)  # the gaps widen: more snapshots early
    assert snapshot_steps(3, 8) == [0, 1, 2, 3] and snapshot_steps(0) == [0]


def test_the_loop_keeps_snapshots_that_hold_the_weights_of_their_step(tok, tmp_path):
    model, keeper, capture = tiny(tok, 0), SnapshotKeeper(tmp_path / "replay", count=6), Capture()
    cfg = PretrainConfig(steps=20, seq_len=32, batch_size=4, log_every=1, pair_task="none", lr=1e-2)
    pretrain(cfg, model=model, tokenizer=tok, documents=documents(), callbacks=[capture, keeper])
    snaps = list_snapshots(tmp_path / "replay")
    assert [s.step for s in snaps] == keeper.saved == snapshot_steps(20, 6) == [0, 1, 2, 4, 9, 20]
    assert [s.full for s in snaps] == [True] + [False] * 5
    reader = tiny(tok, 99)
    for snap in snaps:
        assert load_snapshot(reader, tmp_path / "replay", snap.step) == set()
        for name, p in reader.named_parameters():
            torch.testing.assert_close(p, capture.at[snap.step][name], atol=2e-3, rtol=2e-3)  # fp16
    first, last = capture.at[0], capture.at[20]
    assert any(not torch.allclose(first[n], last[n], atol=1e-2) for n in first)  # it did learn


def test_frozen_weights_are_stored_once(tok, tmp_path):
    """A frozen encoder (feature-based fine-tuning) is in the first snapshot only: the others are small."""
    model = tiny(tok, 0)
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith(model.family.head_prefixes)
    keeper = SnapshotKeeper(tmp_path / "replay", count=4)
    pretrain(PretrainConfig(steps=6, seq_len=32, batch_size=4, log_every=1, pair_task="none"), model=model,
             tokenizer=tok, documents=documents(), callbacks=[keeper])
    first, *later = list_snapshots(tmp_path / "replay")
    assert all(s.path.stat().st_size < first.path.stat().st_size / 2 for s in later)
    reader = tiny(tok, 5)
    load_snapshot(reader, tmp_path / "replay", later[-1].step)
    for p, q in zip(reader.parameters(), model.parameters()):
        torch.testing.assert_close(p, q.detach(), atol=2e-3, rtol=2e-3)


def test_replay_reads_the_right_snapshot(tok, tmp_path):
    """Snapshots of three models with different weights: each step's frame predicts what its model does."""
    models = {0: tiny(tok, 1), 5: tiny(tok, 2), 9: tiny(tok, 3)}
    for step, m in models.items():
        save_snapshot(m, tmp_path, step)
    result = replay(iter_snapshots(tiny(tok, 4), tmp_path), tok, PROBE, k=4)
    assert result.steps == [0, 5, 9]
    assert result.tracked == [c.token for c in fill_mask(models[9], tok, PROBE, k=4)[0].candidates[:3]]
    tops = []
    for step, m in models.items():
        frame, want = result.frame(step), fill_mask(m, tok, PROBE, k=4)[0]
        assert [c.token for c in frame.mask.candidates] == [c.token for c in want.candidates]
        assert [c.probability for c in frame.mask.candidates] == pytest.approx(
            [c.probability for c in want.candidates], abs=2e-3)
        torch.testing.assert_close(frame.attention.patterns, attention_patterns(m, tok, PROBE).patterns,
                                   atol=2e-3, rtol=0)
        assert frame.lens.query.target == result.tracked[0] and len(frame.lens.stage_names) == 3
        shown = {c.token: c.probability for c in want.candidates}
        for word in set(result.tracked) & set(shown):  # a followed word among the top-k: the same probability
            assert frame.tracked[word] == pytest.approx(shown[word], abs=2e-3)
        tops.append(tuple(c.token for c in frame.mask.candidates))
    assert len(set(tops)) > 1  # the three models really differ
    traj = result.trajectory()
    assert list(traj) == result.tracked and all(len(v) == 3 for v in traj.values())


def test_a_later_partial_snapshot_overlays_the_full_one(tok, tmp_path):
    a, b = tiny(tok, 1), tiny(tok, 2)
    heads = [n for n, _ in b.named_parameters() if n.startswith(b.family.head_prefixes)]
    save_snapshot(a, tmp_path, 0)
    save_snapshot(b, tmp_path, 7, names=heads)
    reader = tiny(tok, 3)
    load_snapshot(reader, tmp_path, 7)
    pa, pb = params(a), params(b)
    for name, p in reader.named_parameters():
        torch.testing.assert_close(p, (pb if name in heads else pa)[name], atol=2e-3, rtol=2e-3)


def test_snapshots_of_another_model_are_refused(tok, tmp_path):
    save_snapshot(tiny(tok, 1), tmp_path, 0)
    wider = Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, pretraining_heads=("mlm",)))
    with pytest.raises(SnapshotError, match="does not fit this model"):
        load_snapshot(wider, tmp_path, 0)
    with pytest.raises(SnapshotError, match="no snapshot at step 3"):
        load_snapshot(tiny(tok, 1), tmp_path, 3)
    save_snapshot(tiny(tok, 1, heads=()), tmp_path / "bare", 0)  # an encoder only: the MLM head is not there
    with pytest.raises(SnapshotError, match="lack"):
        list(iter_snapshots(tiny(tok, 1), tmp_path / "bare"))


def test_a_fresh_run_clears_old_snapshots_and_a_resumed_one_keeps_the_earlier(tok, tmp_path):
    folder = tmp_path / "replay"
    for step in (0, 3, 8):
        save_snapshot(tiny(tok, step), folder, step)

    class Event:
        def __init__(self, kind, step, total):
            self.kind, self.step, self.total_steps, self.model = kind, step, total, None

    resumed = SnapshotKeeper(folder, model=tiny(tok, 0))
    resumed(Event("start", 3, 10))
    assert [s.step for s in list_snapshots(folder)] == [0, 3] and resumed.pending[0] > 3
    fresh = SnapshotKeeper(folder, model=tiny(tok, 0))
    fresh(Event("start", 0, 10))
    assert [s.step for s in list_snapshots(folder)] == [0] and list_snapshots(folder)[0].full


def test_snapshots_leave_checkpoints_resume_and_pruning_alone(tok, tmp_path):
    """The run's checkpoints and its snapshots share the run folder: pruning, resuming and the final
    checkpoint behave as without snapshots, and a resumed run continues its snapshots."""
    from bertlab.training.masking import MaskingConfig, MLMCollator
    from bertlab.training.pretrain import pretraining_examples

    out = tmp_path / "run"
    pcfg = PretrainConfig(seq_len=32, pair_task="none")
    data = pretraining_examples(documents(), tok, pcfg)
    collate = MLMCollator(tok, MaskingConfig(), seed=0)
    cfg = dict(lr=1e-2, batch_size=4, max_steps=12, log_every=1, checkpoint_every=3, keep_last=2, out_dir=str(out))
    keeper = SnapshotKeeper(out / "replay")
    model = tiny(tok, 0)

    def stop_at_7(event):
        if event.kind == "step" and event.step == 7:
            stop.set()

    import threading

    stop = threading.Event()
    res = train(model, mlm_nsp_loss, data, TrainConfig(**cfg), collate=collate, callbacks=[keeper, stop_at_7],
                cancel=stop, tokenizer=tok)
    assert res.status == "cancelled" and res.step == 7
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-6", "checkpoint-7"]
    planned = snapshot_steps(12)
    assert 7 not in planned
    assert [s.step for s in list_snapshots(out / "replay")] == [s for s in planned if s < 7] + [7]  # 7: it stopped
    again = SnapshotKeeper(out / "replay")
    res2 = train(tiny(tok, 9), mlm_nsp_loss, data, TrainConfig(**cfg), collate=collate, callbacks=[again],
                 tokenizer=tok, resume_from=latest_checkpoint(out))
    assert res2.status == "completed" and res2.step == 12
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-9", "checkpoint-12"]
    assert [s.step for s in list_snapshots(out / "replay")] == sorted({*planned, 7})
    assert [s.full for s in list_snapshots(out / "replay")] == [True] + [False] * len(planned)
    assert not [p for p in (out / "replay").iterdir() if p.name.startswith(".tmp")]


def test_a_fine_tuned_encoder_replays_through_its_base_models_mlm_head(tok, tmp_path):
    base = tiny(tok, 1)
    tuned = base.with_heads((), "sequence_classification", {0: "negative", 1: "positive"})
    save_snapshot(tuned, tmp_path, 0)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_snapshot(tuned, tmp_path, 4)
    frame_model = with_borrowed_mlm(copy.deepcopy(tuned), base)
    extra = {n for n, _ in frame_model.named_parameters()} - {n for n, _ in tuned.named_parameters()}
    assert extra and all(n.startswith(base.family.head_prefixes) for n in extra)
    result = replay(iter_snapshots(frame_model, tmp_path, extra=extra), tok, PROBE)
    first, last = result.frame(0), result.frame(4)
    # step 0 is the base's encoder with the base's own head: the base's guesses exactly (up to fp16)
    want = fill_mask(base, tok, PROBE, k=5)[0].candidates
    assert [c.token for c in first.mask.candidates] == [c.token for c in want]
    assert first.classes.labels == ["negative", "positive"] and last.classes is not None
    assert last.mask.candidates[0].probability != pytest.approx(first.mask.candidates[0].probability, abs=1e-4)
    assert list(result.trajectory()) == result.tracked


def test_a_folder_without_snapshots_is_a_message(tok, tmp_path):
    from bertlab.inputs import InputError

    with pytest.raises(InputError, match="no snapshots"):
        replay(iter_snapshots(tiny(tok, 0), tmp_path / "none"), tok, PROBE)
    assert isinstance(Path(tmp_path), Path)


def test_a_matrix_with_few_changed_rows_keeps_only_those_rows(tok, tmp_path):
    """An embedding matrix of which training touched a few rows (weight decay moved the rest a little): only
    those rows are stored, and loading gives what storing it whole would have, to the tolerance."""
    from bertlab.training.snapshots import list_snapshots as snaps_in

    model = tiny(tok, 1)
    save_snapshot(model, tmp_path, 0)
    emb = next(n for n, p in model.named_parameters() if p.dim() == 2 and p.shape[0] == tok.vocab_size)
    with torch.no_grad():
        dict(model.named_parameters())[emb].mul_(1 - 1e-4)  # weight decay: every row, far below the tolerance
        dict(model.named_parameters())[emb][[2, 5]] += 1.0
        for n, p in model.named_parameters():
            if n != emb:
                p.mul_(1.5)  # every row of the others moves
    save_snapshot(model, tmp_path, 3, names=[n for n, _ in model.named_parameters()], base=snaps_in(tmp_path)[0])
    from safetensors import safe_open

    with safe_open(str(snaps_in(tmp_path)[1].path), "pt") as f:
        assert f.get_tensor(emb + "@rows").tolist() == [2, 5] and f.get_tensor(emb).shape[0] == 2
    reader = tiny(tok, 7)
    load_snapshot(reader, tmp_path, 3)
    for p, q in zip(reader.parameters(), model.parameters()):
        torch.testing.assert_close(p, q.detach(), atol=1e-3, rtol=2e-3)  # the fp16 weights, within the tolerance


def test_a_finished_runs_snapshots_are_stored_as_what_changed(tok, tmp_path):
    """A finished run's snapshots against its final weights file: smaller, and each gives its step's weights."""
    from bertlab.training.checkpoint import save_model_atomically
    from bertlab.training.snapshots import compact_snapshots, snapshot_bytes

    model, keeper, capture = tiny(tok, 0), SnapshotKeeper(tmp_path / "run" / "replay", count=6), Capture()
    cfg = PretrainConfig(steps=20, seq_len=32, batch_size=4, log_every=1, pair_task="none", lr=1e-2)
    pretrain(cfg, model=model, tokenizer=tok, documents=documents(), callbacks=[capture, keeper])
    save_model_atomically(model, tok, tmp_path / "run")
    folder = tmp_path / "run" / "replay"
    before, after = compact_snapshots(folder, tmp_path / "run" / "model.safetensors")
    assert after == snapshot_bytes(folder) < 0.7 * before  # here most rows move at every step: big lr, tiny model
    assert compact_snapshots(folder, tmp_path / "run" / "model.safetensors") == (after, after)  # once is enough
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")) == []
    reader = tiny(tok, 99)
    for snap in list_snapshots(folder):
        assert load_snapshot(reader, folder, snap.step) == set()
        for name, p in reader.named_parameters():
            torch.testing.assert_close(p, capture.at[snap.step][name], atol=2e-3, rtol=2e-3)
    for name, p in reader.named_parameters():  # the last snapshot is the final model itself
        torch.testing.assert_close(p, dict(model.named_parameters())[name], atol=1e-6, rtol=1e-6)
    (tmp_path / "run" / "model.safetensors").write_bytes(b"another model")
    with pytest.raises(SnapshotError, match="missing or were replaced"):
        load_snapshot(reader, folder, 0)
