"""Training on the real tokens only (`bertlab.fast.unpad_input` / `pad_output`): while a BERT-class model trains
on a padded batch, its encoder runs on the real tokens: the linears, LayerNorms and feed-forward never see
padding, and attention pads q, k and v back for the scores. The outputs at real positions and every gradient
equal the reference (padded) path's; hooks and evaluation keep the padded shapes."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

import bertlab.families  # noqa: F401 (hands Bert its family record)
from bertlab import fast
from bertlab.config import BertConfig
from bertlab.families.bert import Bert

TASKS = ["sequence_classification", "token_classification", None]


def _model(task, layers=3):
    torch.manual_seed(0)
    kw = {"task": task, "id2label": {0: "a", 1: "b", 2: "c"}} if task else {}
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)
    return Bert(cfg)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = mask[2, 3:] = mask[3, 11:] = 0
    return ids, torch.zeros_like(ids), mask


def _padded(model):
    model.bert.packing = False  # the padded path, as before packing existed
    return model


@pytest.fixture
def packings(monkeypatch):
    made = []
    unpad = fast.unpad_input
    monkeypatch.setattr(fast, "unpad_input", lambda x, mask, additive: (made.append(mask), unpad(x, mask, additive))[1])
    return made  # each unpadding's attention mask


@pytest.mark.parametrize("task", TASKS, ids=str)
@pytest.mark.parametrize("first_only", [False, True], ids=["every-position", "cls-only"])
def test_packed_training_equals_the_padded_path(task, first_only, packings):
    model = _model(task).train()
    ref = _padded(copy.deepcopy(model)).train()
    ids, types, mask = _batch()
    kwargs = {"all_positions": not first_only} if task == "sequence_classification" else {}
    a, b = model(ids, types, mask, **kwargs), ref(ids, types, mask, **kwargs)
    assert len(packings) == 1  # the model packed; the reference did not
    keep = mask.bool()
    out_a, out_b = (a.logits, b.logits) if task else (a.last_hidden_state, b.last_hidden_state)
    if out_a.dim() == 3:
        out_a, out_b = out_a[keep], out_b[keep]
    assert (out_a - out_b).abs().max() <= 1e-5
    out_a.square().sum().backward()
    out_b.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_the_padding_is_never_computed(packings):
    """The first feed-forward of a packed step sees as many rows as there are real tokens."""
    model = _model("token_classification").train()
    ids, types, mask = _batch()
    rows = []
    handle = model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda mod, inp, out: rows.append(inp[0].shape[:-1].numel()))
    model(ids, types, mask)
    handle.remove()
    assert rows == [int(mask.sum())] and int(mask.sum()) < mask.numel()


def test_hooks_and_evaluation_keep_the_padded_shapes(packings):
    model = _model("token_classification").train()
    ids, types, mask = _batch()
    name = model.family.hook_name(1, "hook_resid_post")
    _, cache = model.run_with_cache(ids, types, mask, names=[name])
    assert cache[name].shape == (4, 12, 32) and not packings  # a hook watches: no packing
    model.eval()
    model(ids, types, mask)
    assert not packings  # evaluation: the padded path, whose padding positions equal transformers' too
    model.train()
    model(ids, types, torch.ones_like(mask))
    assert not packings  # nothing to pack


@pytest.mark.parametrize("task", TASKS, ids=str)
def test_evaluation_packs_when_asked_and_keeps_the_outputs(task, packings):
    model = _model(task).eval()
    model.bert.packing = "always"
    ref = _padded(copy.deepcopy(model)).eval()
    ids, types, mask = _batch()
    with torch.no_grad():
        a, b = model(ids, types, mask), ref(ids, types, mask)
    assert len(packings) == 1
    keep = mask.bool()
    assert torch.allclose(a.last_hidden_state[keep], b.last_hidden_state[keep], atol=1e-5)
    assert not a.last_hidden_state[~keep].any()  # zeros at the padding
    if task == "sequence_classification":
        assert torch.allclose(a.logits, b.logits, atol=1e-5)
    with torch.no_grad():
        model(ids, types, torch.ones_like(mask))
    assert len(packings) == 1  # nothing padded: nothing to pack


def test_two_runs_at_the_same_time_each_train_as_they_would_alone():
    """Two students' runs in one process (threads, as two panels or a shared kernel): each keeps its own word-table
    unpadding, and ends with the weights it reaches alone."""
    from bertlab.tasks import collate
    from bertlab.tasks.features import ClassificationFeature
    from bertlab.training.finetune import sequence_loss
    from bertlab.training.loop import TrainConfig, train

    g = torch.Generator().manual_seed(3)
    data = [ClassificationFeature(str(i), torch.randint(5, 100, (int(n),), generator=g).tolist(), [0] * int(n),
                                  int(n) % 3) for i, n in enumerate(torch.randint(4, 12, (48,), generator=g))]
    cfgs = [TrainConfig(lr=lr, max_steps=6, batch_size=8, seed=0, warmup_steps=0, max_grad_norm=1.0,
                        precision="fp32", log_every=1) for lr in (1e-2, 3e-3)]
    alone = [_model("sequence_classification") for _ in cfgs]
    for model, cfg in zip(alone, cfgs):
        assert train(model, sequence_loss, data, cfg, collate=collate).ok
    together = [_model("sequence_classification") for _ in cfgs]
    for model in together:  # each backward pauses just before the word table's gradient: the other run steps in
        model.bert.embeddings.register_forward_hook(
            lambda module, args, out: out.register_hook(lambda grad: time.sleep(0.002)) and None)
    start, results = threading.Barrier(len(cfgs)), [None] * len(cfgs)

    def run(i: int) -> None:
        start.wait(30)
        results[i] = train(together[i], sequence_loss, data, cfgs[i], collate=collate)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(cfgs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert all(r is not None and r.ok for r in results)
    for a, b in zip(alone, together):
        for (name, x), y in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_by_default_training_packs_on_a_cpu_in_fp32_alone():
    """Packing paid in fp32 on a CPU (bench/results/finetune_packing_fp32.json); under bf16 autocast
    (finetune_packing.json) and on an H100 (packing_cuda.json) the padded path measured faster: "cpu", the
    default, packs in fp32 on a CPU only; True packs on any device. (A mask on the meta device stands for a
    GPU's.)"""
    model = _model("sequence_classification").train()
    _, _, mask = _batch()
    elsewhere = mask.to("meta")

    def packs(m, training=True):
        return fast.unpads(model.bert.packing, training, m, None, watched=False)

    assert model.bert.packing == "cpu"
    assert packs(mask) and not packs(elsewhere) and not packs(mask, training=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not packs(mask)
        model.bert.packing = True
        assert packs(mask)
    assert packs(mask) and packs(elsewhere)
    model.bert.packing = False
    assert not packs(mask) and not packs(elsewhere)
    model.bert.packing = "always"
    assert packs(mask, training=False) and packs(elsewhere, training=False)
    assert not packs(torch.ones_like(mask)) and not fast.unpads("always", True, mask, torch.ones(3, 4), False)


def test_unpad_and_pad_are_each_others_inverse():
    x = torch.randn(4, 12, 5, requires_grad=True)
    _, _, mask = _batch()
    packed, where = fast.unpad_input(x, mask, torch.zeros(4, 1, 1, 12))
    assert packed.shape == (1, int(mask.sum()), 5)
    back = fast.pad_output(packed, where)
    keep = mask.bool()
    assert torch.equal(back[keep], x[keep]) and not back[~keep].any()
    assert torch.equal(fast.repack(back, where), packed)
    back.sum().backward()
    assert torch.equal(x.grad, keep[..., None].float().expand_as(x))
