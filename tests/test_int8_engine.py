"""The int8 engine (`bertlab.compressed.engine`): an int8 BERT's layers compiled for inference give the modules'
own outputs to the last bit, run only when nobody watches, and follow the model when its layers change."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from bertlab.compress.quantize import quantize
from bertlab.compressed.engine import Int8Engine
from bertlab.compressed.structure import int8_linear, prune_heads, quantize_rows
from bertlab.config import BertConfig
from bertlab.families import FAMILIES
from bertlab.model import BertEmbeddings, BertLayer
from bertlab.tasks import SST2_LABELS

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_int8(model_type: str = "bert", act: str = "gelu", pruned: dict | None = None,
              task: str = "sequence_classification", **extra):
    """A tiny random int8 classifier (3 layers, 32 wide, 4 heads), some heads pruned first if asked."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     hidden_act=act, model_type=model_type, task=task, id2label=dict(SST2_LABELS), **extra)
    model = FAMILIES[model_type].model_class(cfg).eval()
    return quantize(prune_heads(model, pruned) if pruned else model)


def inputs(batch: int = 3, seq: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 400, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[0, seq - 4:] = 0  # padding in the first sequence
    return ids, torch.zeros_like(ids), mask


def modules_only(model):
    """The same model with no engine: every call through the modules."""
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if hasattr(m, "engine"):
            m.engine = None
    return plain


def spy(monkeypatch, cls) -> list:
    """The instances of `cls` whose module code ran, one entry per call."""
    calls = []
    forward = cls.forward

    def counted(self, *args, **kwargs):
        calls.append(self)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counted)
    return calls


@pytest.fixture
def layer_calls(monkeypatch):
    """How many times a BertLayer's module code ran."""
    return spy(monkeypatch, BertLayer)


@pytest.mark.parametrize("model_type, act, extra", [
    ("bert", "gelu", {}), ("bert", "gelu_new", {}), ("bert", "relu", {}),
    ("bert", "gelu", {"pruned": {0: [1, 2], 2: [0]}}),  # layers of 2, 4 and 3 heads
    ("bert", "gelu", {"task": "token_classification", "add_pooler": False}),
    ("roberta", "gelu", {"position_offset": 2, "pad_token_id": 1}),
    ("electra", "gelu", {"embedding_size": 16, "extra": {"embedding_size": 16}}),
])
def test_the_engine_gives_the_modules_outputs_exactly(model_type, act, extra, layer_calls, monkeypatch):
    model = tiny_int8(model_type, act, **extra)
    plain = modules_only(model)
    embedding_calls = spy(monkeypatch, BertEmbeddings)
    for batch, seq in ((1, 1), (1, 9), (3, 11)):
        ids, types, mask = inputs(batch, seq)
        with torch.inference_mode():
            layer_calls.clear()
            embedding_calls.clear()
            out = model(ids, types, mask)
            assert not layer_calls, "the engine did not run"
            # BERT's embeddings run compiled too; RoBERTa's (its own positions) and ELECTRA's (a projection after)
            # as modules
            assert len(embedding_calls) == (0 if model_type == "bert" else 1)
            ref = plain(ids, types, mask)
            assert len(layer_calls) == 3  # the copy without an engine ran its modules
        assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
        assert torch.equal(out.logits, ref.logits)
        assert (out.pooler_output is None) == (ref.pooler_output is None)  # ELECTRA and add_pooler=False: none
        assert out.pooler_output is None or torch.equal(out.pooler_output, ref.pooler_output)


def test_the_engine_steps_aside_when_anyone_watches(layer_calls):
    model = tiny_int8()
    plain = modules_only(model)
    ids, types, mask = inputs()
    with torch.no_grad():
        ref = plain(ids, types, mask)
        _, cache = model.run_with_cache(ids, types, mask)  # hook points: the modules run and every hook fires
        assert set(cache) == set(model.hook_names()) and len(layer_calls) == 3 + 3
        _, ref_cache = plain.run_with_cache(ids, types, mask)
        assert all(torch.equal(cache[n], ref_cache[n]) for n in cache)

        seen = []  # a plain torch hook on a module deep inside
        handle = model.bert.encoder.layer[1].intermediate.dense.register_forward_hook(lambda m, i, o: seen.append(o))
        layer_calls.clear()
        assert torch.equal(model(ids, types, mask).logits, ref.logits) and len(seen) == 1 and len(layer_calls) == 3
        handle.remove()
        layer_calls.clear()
        model(ids, types, mask)
        assert not layer_calls and len(seen) == 1  # gone with the hook

        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)  # every module's
        try:
            layer_calls.clear()
            model(ids, types, mask)
            assert len(layer_calls) == 3
        finally:
            handle.remove()

        for m in model.modules():  # a lesson asked for the eager attention path
            if hasattr(m, "path"):
                m.path = "eager"
        layer_calls.clear()
        out = model(ids, types, mask)
        assert len(layer_calls) == 3 and (out.logits - ref.logits).abs().max() < 1e-5

    # with gradients, in training mode, with masked heads or a few rows asked: the modules
    model = tiny_int8()
    for call in (lambda: model(ids, types, mask),
                 lambda: model.train()(ids, types, mask),
                 lambda: model.eval()(ids, types, mask, head_mask=torch.ones(3, 4)),
                 lambda: model.eval()(ids, types, mask, all_positions=False)):
        layer_calls.clear()
        with torch.enable_grad():
            call()
        assert len(layer_calls) == 3
    with torch.no_grad():
        layer_calls.clear()
        model(ids, types, mask)
        assert not layer_calls


def test_the_engine_follows_the_model_when_its_layers_change(layer_calls):
    model = tiny_int8()
    ids, types, mask = inputs()
    with torch.no_grad():
        first = model(ids, types, mask).logits  # built
        layer = model.bert.encoder.layer[1]  # its feed-forward's int8 Linear replaced by another
        q, scale = quantize_rows(torch.randn(32, 64))
        layer.output.dense = int8_linear(q, scale, layer.output.dense.bias())
        layer_calls.clear()
        out = model(ids, types, mask)
        assert not layer_calls and not torch.equal(out.logits, first)
        assert torch.equal(out.logits, modules_only(model)(ids, types, mask).logits)

        norm = model.bert.encoder.layer[1].output.LayerNorm  # a parameter replaced, one changed in place
        norm.weight = torch.nn.Parameter(norm.weight * 2)
        model.bert.encoder.layer[0].attention.output.LayerNorm.bias.add_(0.5)
        out = model(ids, types, mask)
        assert torch.equal(out.logits, modules_only(model)(ids, types, mask).logits)

        emb = model.bert.embeddings  # the compiled embeddings and pooler follow too
        emb.word_embeddings.weight = torch.nn.Parameter(emb.word_embeddings.weight * 2)
        q, scale = quantize_rows(torch.randn(32, 32))
        model.bert.pooler.dense = int8_linear(q, scale, None)
        layer_calls.clear()
        out = model(ids, types, mask)
        assert not layer_calls and torch.equal(out.logits, modules_only(model)(ids, types, mask).logits)
        assert torch.equal(out.pooler_output, modules_only(model)(ids, types, mask).pooler_output)

        model.bert.encoder.layer[2].intermediate.dense = torch.nn.Linear(32, 64)  # a float Linear: not int8 now
        layer_calls.clear()
        out = model(ids, types, mask)
        assert len(layer_calls) == 3 and torch.equal(out.logits, modules_only(model)(ids, types, mask).logits)


def test_copies_and_saved_models_build_their_own_engine(layer_calls):
    model = tiny_int8()
    ids, types, mask = inputs()
    with torch.no_grad():
        ref = model(ids, types, mask).logits
        twin = copy.deepcopy(model)
        assert isinstance(twin.bert.engine, Int8Engine) and twin.bert.engine is not model.bert.engine
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        layer_calls.clear()
        for other in (twin, loaded):
            assert torch.equal(other(ids, types, mask).logits, ref)
        assert not layer_calls
        twin.bert.encoder.layer[0].output.LayerNorm.bias.add_(1.0)  # the copy's weights are its own
        assert torch.equal(model(ids, types, mask).logits, ref)
        assert not torch.equal(twin(ids, types, mask).logits, ref)


def test_without_torchscript_the_engine_runs_the_same_arithmetic_in_python(monkeypatch, layer_calls):
    def no_script(*args, **kwargs):
        raise RuntimeError("TorchScript is gone")

    monkeypatch.setattr(torch.jit, "script", no_script)
    model = tiny_int8()
    ids, types, mask = inputs()
    with torch.no_grad():
        out = model(ids, types, mask)
        assert not layer_calls
        assert torch.equal(out.logits, modules_only(model)(ids, types, mask).logits)


def test_float_models_have_no_engine():
    cfg = BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    assert FAMILIES["bert"].model_class(cfg).bert.engine is None
