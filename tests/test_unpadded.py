"""Training on the real tokens only: while a BERT-class model trains on a padded batch, its encoder packs the
real tokens (`Packing`): the linears, LayerNorms and feed-forward never see padding, and attention pads q, k
and v back for the scores. The outputs at real positions and every gradient equal the padded path's; hooks and
evaluation keep the padded shapes."""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import pytest
import torch

import bertlab.families  # noqa: F401 (hands Bert its family record)
import bertlab.model as core
from bertlab.config import BertConfig
from bertlab.model import Bert

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
    init = core.Packing.__init__
    monkeypatch.setattr(core.Packing, "__init__", lambda self, *a: (made.append(a), init(self, *a))[1])
    return made  # each Packing's arguments: (mask, dtype[, index the host found])


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


@pytest.mark.parametrize("task", ["sequence_classification", None], ids=["classifier", "tied-mlm-decoder"])
def test_the_word_table_gradient_accumulates_in_place_as_embedding_backward_does(task, monkeypatch):
    model = (_model(task) if task else _model(None).with_heads(("mlm",))).train()
    assert task or model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    ref = copy.deepcopy(model).train()
    ids, types, mask = _batch()
    ids[mask == 0] = model.config.pad_token_id  # padding rows get no gradient
    ids[0, :4] = ids[1, 0]  # a repeated token: its rows add up

    def two_micro_batches(m):
        for _ in range(2):  # gradients accumulate over micro-batches
            out = m(ids, types, mask)
            (out.logits if task else out.mlm_logits).square().sum().backward()

    two_micro_batches(model)
    with monkeypatch.context() as mp:
        mp.setattr(core, "lookup", lambda table, ids, owner: table(ids))  # torch's own embedding backward
        two_micro_batches(ref)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    emb = model.bert.embeddings
    table = emb.word_embeddings.weight
    assert float(table.grad[model.config.pad_token_id].abs().max()) == 0.0
    if task:  # nothing else writes the table's gradient: it is the kept buffer, reused the next step
        assert table.grad is emb._grad_buffer.tensor
        model.zero_grad(set_to_none=True)
        two_micro_batches(model)
        assert table.grad is emb._grad_buffer.tensor
        torch.testing.assert_close(table.grad, ref.bert.embeddings.word_embeddings.weight.grad)
    model.eval()
    assert emb._grad_buffer is None  # evaluation gives the memory back
    with torch.no_grad():
        model(ids, types, mask)  # and evaluation takes torch's own lookup
    assert emb._grad_buffer is None


def test_a_grad_table_zeroes_the_rows_written_and_all_of_it_when_unsure():
    weight = torch.randn(50, 4)
    table = core.GradTable(weight)
    ids = torch.tensor([3, 7, 3, 9])
    with core.row_gradients():
        assert table.zeroed() is table.tensor and not table.tensor.any()
        table.add(ids, torch.ones(4, 4))
        assert table.touched().tolist() == [3, 7, 9] and table.tensor[3].tolist() == [2.0] * 4
        table.tensor.mul_(0.5)  # a write it did not make: it cannot vouch for the other rows any more
        assert not table.clean() and table.touched() is None
        table.tensor[20] = 1.0
        assert not table.zeroed().any()  # zeroed whole
        table.add(ids, torch.ones(4, 4))
        table.tensor[20] = 1.0  # a row it never wrote, unknown to it (as a write through .data would be)...
        table.version = table.tensor._version  # ...that it was told nothing of
        assert table.zeroed()[20].tolist() == [1.0] * 4 and not table.tensor[[3, 7, 9]].any()  # rows alone
        table.add(ids, torch.ones(4, 4))
        table.taint()  # a clip by NaN
        assert table.touched() is None and not table.zeroed().any()
    table.tensor[20] = 1.0
    table.version = table.tensor._version
    assert not table.zeroed().any()  # outside the training loop's block: always whole


def test_training_with_row_gradients_equals_torchs_embedding_backward(monkeypatch):
    """The loop zeroes the word table's gradient by rows and clips with the norm of those rows: the same weights as
    torch's own embedding backward (a fresh dense gradient each step) and clip_grad_norm_, step after step."""
    from bertlab.tasks import collate
    from bertlab.tasks.features import ClassificationFeature
    from bertlab.training.finetune import sequence_loss
    from bertlab.training.loop import TrainConfig, train

    g = torch.Generator().manual_seed(2)
    data = [ClassificationFeature(str(i), torch.randint(5, 100, (int(n),), generator=g).tolist(), [0] * int(n),
                                  int(n) % 3) for i, n in enumerate(torch.randint(4, 12, (48,), generator=g))]

    def loss(model, batch):
        value, metrics = sequence_loss(model, batch)  # the lab's fine-tuning loss
        return 100 * value, metrics  # large: the clip acts

    cfg = TrainConfig(lr=1e-2, max_steps=6, batch_size=8, seed=0, warmup_steps=0, max_grad_norm=1.0,
                      precision="fp32", log_every=1)
    ours, ref = _model("sequence_classification"), _model("sequence_classification")
    res = train(ours, loss, data, cfg, collate=collate)
    assert res.status == "completed" and ours.bert.embeddings._grad_buffer is not None
    with monkeypatch.context() as mp:
        mp.setattr(core, "lookup", lambda table, ids, owner: table(ids))  # torch's own embedding backward
        mp.setattr(torch.optim.AdamW, "__init__", _unfused(torch.optim.AdamW.__init__))  # and its clip, then step
        res_ref = train(ref, loss, data, cfg, collate=collate)
    assert [h["grad_norm"] for h in res.history] == pytest.approx([h["grad_norm"] for h in res_ref.history], rel=1e-4)
    assert min(h["grad_norm"] for h in res.history) > 1.0  # every step clipped
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_two_runs_at_the_same_time_each_train_as_they_would_alone():
    """Two students' runs in one process (threads, as two panels or a shared kernel): each keeps its own word-table
    gradient, its own row flag and its own heap watch, and ends with the weights it reaches alone."""
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


def _unfused(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "fused": False})

    return __init__


@contextlib.contextmanager
def _no_device_lookups():
    """Inside, finding the real tokens on the model's side fails the test (on a GPU it waits for the device)."""
    def refuse(*a, **k):
        raise AssertionError("the model looked for the real tokens itself")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "nonzero", refuse)
        mp.setattr(torch.Tensor, "all", refuse)
        yield


def test_a_host_plan_packs_from_its_own_index_and_keeps_the_outputs(packings):
    """The training loop's plan: the padding found on the host's mask, used for the device's copy of it."""
    model = _model("token_classification").train()
    ref = _padded(copy.deepcopy(model)).train()
    ids, types, mask = _batch()
    on_device = mask.clone()  # stands for the GPU copy: another tensor with the same values
    want = ref(ids, types, mask).logits
    with core.packing_plan(mask, on_device) as plan:
        assert plan.padding == pytest.approx(1 - int(mask.sum()) / mask.numel())
        with _no_device_lookups():
            got = model(ids, types, on_device).logits
    assert len(packings) == 1 and packings[0][2] is plan.index
    assert torch.equal(plan.index, mask.reshape(-1).nonzero().squeeze(1))
    keep = mask.bool()
    assert (got[keep] - want[keep]).abs().max() <= 1e-5


def test_a_plan_with_no_padding_skips_packing_and_other_masks_ignore_the_plan(packings):
    model = _model("sequence_classification").train()
    ids, types, mask = _batch()
    full = torch.ones_like(mask)
    with core.packing_plan(full, full.clone()) as plan:
        with _no_device_lookups():
            model(ids, types, plan.mask)
        assert not packings  # nothing padded, and the model did not have to look to know it
        model(ids, types, mask)  # a mask the plan is not for (a loss that made its own): found by the model
    assert len(packings) == 1 and packings[0][2] is None
    with core.packing_plan(mask, mask.clone()) as plan:
        seen = []
        worker = threading.Thread(target=lambda: seen.append(core._plan_for(plan.mask)))
        worker.start()
        worker.join()
        assert seen == [None] and core._plan_for(plan.mask) is plan  # one thread's plan is not another's
    assert core._plan_for(plan.mask) is None  # and it ends with the block


def test_the_training_loop_hands_the_encoder_its_plan(packings):
    from bertlab.training.loop import TrainConfig, train

    model = _model("sequence_classification").train()
    g = torch.Generator().manual_seed(2)
    data = [{"ids": torch.randint(5, 100, (int(n),), generator=g), "label": i % 3}
            for i, n in enumerate(torch.randint(3, 12, (16,), generator=g))]

    def collate(rows):
        ids = torch.nn.utils.rnn.pad_sequence([r["ids"] for r in rows], batch_first=True)
        return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": (ids != 0).long(),
                "labels": torch.tensor([r["label"] for r in rows])}

    def loss(m, b):
        logits = m(b["input_ids"], b["token_type_ids"], b["attention_mask"]).logits
        return torch.nn.functional.cross_entropy(logits, b["labels"])

    cfg = TrainConfig(max_steps=3, batch_size=4, device="cpu", precision="fp32", log_every=1, seed=0)
    train(model, loss, data, cfg, collate=collate).raise_for_status()
    assert len(packings) == 3 and all(len(a) == 3 and a[2] is not None for a in packings)


def test_by_default_training_packs_on_a_cpu_alone():
    """On an H100 the padded path measured faster (bench/results/packing_cuda.json): "cpu", the default, packs
    there only; True packs on any device. (A mask on the meta device stands for a GPU's.)"""
    model = _model("sequence_classification").train()
    ids, types, mask = _batch()
    elsewhere = mask.to("meta")
    assert model.bert.packing == "cpu"
    assert model.bert._packs(mask, None) and not model.bert._packs(elsewhere, None)
    model.bert.packing = True
    assert model.bert._packs(mask, None) and model.bert._packs(elsewhere, None)
    model.bert.packing = False
    assert not model.bert._packs(mask, None) and not model.bert._packs(elsewhere, None)
    model.bert.packing = "always"
    model.eval()
    assert model.bert._packs(mask, None) and model.bert._packs(elsewhere, None)
