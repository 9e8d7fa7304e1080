"""Training on the real tokens only: while a BERT-class model trains on a padded batch, its encoder packs the
real tokens (`Packing`): the linears, LayerNorms and feed-forward never see padding, and attention pads q, k
and v back for the scores. The outputs at real positions and every gradient equal the padded path's; hooks and
evaluation keep the padded shapes."""

from __future__ import annotations

import copy

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
    monkeypatch.setattr(core.Packing, "__init__", lambda self, *a: (made.append(1), init(self, *a))[1])
    return made


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
        assert table.grad is emb._grad_buffer
        model.zero_grad(set_to_none=True)
        two_micro_batches(model)
        assert table.grad is emb._grad_buffer
        torch.testing.assert_close(table.grad, ref.bert.embeddings.word_embeddings.weight.grad)
    model.eval()
    assert emb._grad_buffer is None  # evaluation gives the memory back
    with torch.no_grad():
        model(ids, types, mask)  # and evaluation takes torch's own lookup
    assert emb._grad_buffer is None
