"""The compression lab on tiny random models: pruning equals masking, int8 stays close to
float32 and keeps every hook, saved folders reload exactly, distillation brings the student nearer
the teacher, head scores find a dead head, and the `bertlab compress` commands write folders that
`bertlab.load` and `bertlab evaluate` read."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from safetensors import safe_open
from tiny_models import pruned_and_masked

import bertlab
from bertlab.cli import main
from bertlab.compress.distill import DistillConfig, distill, make_student, soft_loss_on, student_layers
from bertlab.compress.lab import TaskData
from bertlab.compress.measure import memory_bytes
from bertlab.compress.prune import head_importance, head_mask_hooks, heads_to_prune, prune
from bertlab.compress.quantize import quantize
from bertlab.compressed.storage import save_compressed
from bertlab.compressed.structure import (
    CompressError,
    Int8Rows,
    apply_int8,
    heads_per_layer,
    prune_heads,
    quantizable_embeddings,
    quantizable_linears,
    quantize_rows,
)
from bertlab.config import BertConfig
from bertlab.families import FAMILIES
from bertlab.loading import save_pretrained
from bertlab.tasks import SST2_LABELS
from bertlab.weights import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

# int8 tolerance (stated in docs/compression.md): the final hidden states (LayerNorm'd, about unit scale) of a
# dynamic-int8 model stay within 0.1 of float32's everywhere and 0.02 on average.
INT8_MAX_DIFF, INT8_MEAN_DIFF = 0.1, 0.02

WORDS_POS = ["good", "great", "fun", "lovely", "brilliant", "warm", "moving", "funny"]
WORDS_NEG = ["bad", "dull", "awful", "boring", "poor", "cold", "flat", "weak"]


def tiny(model_type: str = "bert", vocab: int = 30522, layers: int = 2, seed: int = 0, **extra):
    """A tiny random SST-2 classifier of a family (2 layers, 32 wide, 4 heads, no dropout)."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, model_type=model_type,
                     type_vocab_size=0 if model_type == "distilbert" else 2,
                     task="sequence_classification", id2label=dict(SST2_LABELS), **extra)
    return FAMILIES[model_type].model_class(cfg).eval()


def batch(vocab: int = 30522, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    return ids, torch.zeros_like(ids), mask


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    """A small SST-2 folder (train.tsv + dev.tsv) whose label a word decides."""
    folder = tmp_path_factory.mktemp("sst2")
    rng = random.Random(0)

    def rows(n):
        out = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            word = rng.choice(WORDS_POS if label else WORDS_NEG)
            out.append(f"the film was {word} and {rng.choice(['long', 'short', 'new', 'old'])}\t{label}")
        return "\n".join(out) + "\n"

    (folder / "train.tsv").write_text(rows(96))
    (folder / "dev.tsv").write_text(rows(32))
    return folder


# ---------------------------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_a_pruned_model_equals_the_original_with_those_heads_masked(model_type):
    model = tiny(model_type)
    ids, types, mask = batch()
    gone = {0: [1, 3], 1: [0]}
    small, out, ref = pruned_and_masked(model, ids, types, mask, gone)
    assert heads_per_layer(small) == [2, 3]
    q = small.get_submodule(small.family.hook_name(0, "hook_q").rsplit(".", 1)[0])
    assert sum(p.numel() for p in q.parameters()) < sum(p.numel() for p in model.parameters())  # smaller for real
    assert torch.allclose(out.last_hidden_state, ref.last_hidden_state, atol=1e-5)
    assert torch.allclose(out.logits, ref.logits, atol=1e-5)
    # hooks read the layer's own heads; the same masked reference through hook_z
    _, cache = small.run_with_cache(ids, types, mask, names=lambda n: n.endswith("hook_pattern"))
    assert [cache[small.family.hook_name(i, "hook_pattern")].shape[1] for i in range(2)] == [2, 3]
    with pytest.raises(ValueError, match="heads were pruned, so the layers cannot be shown side by side"):
        cache.stack("hook_pattern")  # what the Attention tab does: a message, not a stacking error
    with torch.no_grad(), model.hooks(head_mask_hooks(model, gone)):
        assert torch.allclose(model(ids, types, mask).logits, out.logits, atol=1e-5)
    # pruning again counts in original head numbers
    prune_heads(small, {0: [0]})
    assert small.config.extra["pruned_heads"] == {"0": [0, 1, 3], "1": [0]}
    with pytest.raises(CompressError, match="without heads"):
        prune_heads(small, {0: [2]})


def test_head_importance_finds_a_dead_head_and_pruning_removes_it_first(sst2, tok):
    model = tiny()
    dead = model.get_submodule(model.family.hook_name(1, "hook_q").rsplit(".", 1)[0])
    with torch.no_grad():  # head 2 of layer 1 writes nothing: its values are zero
        dead.value.weight[2 * 8:3 * 8] = 0
        dead.value.bias[2 * 8:3 * 8] = 0
    data = TaskData.read("sst2", tok, model, data=str(sst2))
    scores = head_importance(model, data.batches(tok, model, 32, batch_size=16))
    assert [len(s) for s in scores] == [4, 4]
    assert float(scores[1][2]) == 0 and all(float(s.min()) >= 0 for s in scores)
    assert all(abs(float(s.norm()) - 1) < 1e-5 for s in scores)  # Michel et al.: per-layer L2 normalised
    assert 2 in heads_to_prune(model, scores, 7)[1]
    half = prune(model, scores, 0.5)
    assert sum(heads_per_layer(half)) == 4 and min(heads_per_layer(half)) >= 1
    assert sum(heads_per_layer(model)) == 8  # the original is unchanged
    with pytest.raises(CompressError, match="keep must leave between 1 and 8"):
        heads_to_prune(model, scores, 9)


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_int8_stays_within_the_stated_tolerance_and_keeps_every_hook(model_type):
    extra = {"position_offset": 2, "pad_token_id": 1} if model_type == "roberta" else {}
    model = tiny(model_type, **extra)
    ids, types, mask = batch()
    q = quantize(model)
    with torch.no_grad():
        ref, out = model(ids, types, mask), q(ids, types, mask)
    diff = (out.last_hidden_state - ref.last_hidden_state).abs()
    assert float(diff.max()) <= INT8_MAX_DIFF and float(diff.mean()) <= INT8_MEAN_DIFF
    assert out.logits.argmax(-1).tolist() == ref.logits.argmax(-1).tolist() or float(
        (out.logits - ref.logits).abs().max()) < 0.05
    assert not any(isinstance(m, torch.nn.Linear) and n.startswith(model.family.prefix + ".")
                   for n, m in q.named_modules())  # every encoder Linear is int8
    assert memory_bytes(q) < memory_bytes(model)
    out, cache = q.run_with_cache(ids, types, mask)
    assert set(cache) == set(q.hook_names())  # every hook still fires
    result = cache[q.family.hook_name(0, "hook_result")]  # [batch, seq, head, d_model]
    assert result.shape == (3, 12, 4, 32) and torch.isfinite(result).all()
    assert type(next(iter(model.modules()))) is type(next(iter(q.modules())))
    with pytest.raises(CompressError, match="quantized already"):
        quantize(q)


def test_bertlabs_int8_linear_gives_torchs_dynamic_int8_linear_outputs_exactly():
    """`Int8Linear` calls the kernel of torch's dynamic-int8 Linear directly: bit-equal outputs, with and
    without bias, for 2-d and 3-d inputs."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from bertlab.compressed.structure import Int8Linear, int8_linear

    torch.manual_seed(0)
    for bias in (torch.randn(48), None):
        q, scale = quantize_rows(torch.randn(48, 32))
        ours = int8_linear(q, scale, bias)
        theirs = DynamicLinear(32, 48, bias_=bias is not None, dtype=torch.qint8)
        theirs.set_weight_bias(*ours._weight_bias())
        assert isinstance(ours, Int8Linear) and isinstance(ours, DynamicLinear)
        for x in (torch.randn(5, 32) * 3, torch.randn(2, 7, 32)):
            assert torch.equal(ours(x), theirs(x))


def test_analysis_functions_run_on_an_int8_model(tok):
    from bertlab.analysis import encode_input
    from bertlab.analysis.ablation import masked_log_probs, masked_query
    from bertlab.analysis.attention import attention_patterns
    from bertlab.analysis.mask import fill_mask
    from bertlab.analysis.representation import input_representation
    from bertlab.analysis.similarity import batch_hidden_states

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, pretraining_heads=("mlm", "nsp"))
    q = quantize(FAMILIES["bert"].model_class(cfg).eval())
    text = f"the cat sat on the {tok.mask_token} today ."
    assert fill_mask(q, tok, text, k=3)
    query = masked_query(q, tok, text)
    assert masked_log_probs(q, query, torch.ones(2, 2, 4)).shape == (2, tok.vocab_size)
    assert attention_patterns(q, tok, "the cat sat", "on the mat").patterns.shape[:2] == (2, 4)
    assert batch_hidden_states(q, tok, [encode_input(q, tok, "the cat sat")])[0].shape[0] == 3
    assert input_representation(q, tok, "the cat sat") is not None


# ---------------------------------------------------------------------------------------------
# Saved folders
# ---------------------------------------------------------------------------------------------
def test_saved_compressed_folders_reload_with_equal_outputs(tmp_path, tok):
    model = tiny()
    ids, types, mask = batch()
    save_pretrained(model, tok, tmp_path / "fp32")
    variants = {
        "int8": quantize(model),
        "pruned": prune_heads(copy.deepcopy(model), {0: [0, 2], 1: [3]}),
        "pruned-int8": quantize(prune_heads(copy.deepcopy(model), {1: [1]})),
    }
    for name, small in variants.items():
        folder = save_pretrained(small, tok, tmp_path / name)  # save_pretrained hands compressed models on
        again, tok2 = bertlab.load(str(folder))
        with torch.no_grad():
            a, b = small(ids, types, mask), again(ids, types, mask)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.last_hidden_state, b.last_hidden_state), name
        assert heads_per_layer(again) == heads_per_layer(small)
        assert tok2.vocab_size == tok.vocab_size
    config = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert config["bertlab_quantization"]["format"] == 1
    with safe_open(str(tmp_path / "int8" / "model.safetensors"), "pt") as f:
        query = "bert.encoder.layer.0.attention.self.query.weight"
        assert f.get_tensor(query).dtype == torch.int8 and f.get_tensor(query + "_scale").dtype == torch.float32
        assert f.get_tensor("bert.embeddings.word_embeddings.weight").dtype == torch.int8
    size = {n: (tmp_path / n / "model.safetensors").stat().st_size for n in ("fp32", "int8")}
    assert size["int8"] < 0.4 * size["fp32"]
    assert json.loads((tmp_path / "pruned" / "config.json").read_text())["pruned_heads"] == {"0": [0, 2], "1": [3]}


@pytest.mark.parametrize("model_type, extra", [
    ("bert", {}), ("distilbert", {}), ("albert", {"embedding_size": 16, "extra": {"embedding_size": 16}}),
])
def test_fused_int8_query_key_value_equal_three_int8_linears(model_type, extra):
    model = tiny(model_type, **extra)
    fused = quantize(model)
    unfused = copy.deepcopy(model).eval()
    with torch.no_grad():
        linears = {n: quantize_rows(unfused.get_submodule(n).weight) for n in quantizable_linears(unfused)}
        tables = {n: quantize_rows(unfused.get_parameter(n)) for n in quantizable_embeddings(unfused)}
        apply_int8(unfused, linears, tables, fuse_qkv=False)
    rows = [m for m in fused.modules() if isinstance(m, Int8Rows)]
    assert rows and not any(isinstance(m, Int8Rows) for m in unfused.modules())
    ids, types, mask = batch()
    types = None if model_type == "distilbert" else types
    with torch.no_grad():
        a, b = fused(ids, types, mask), unfused(ids, types, mask)
        assert torch.equal(a.last_hidden_state, b.last_hidden_state) and torch.equal(a.logits, b.logits)
        if model_type == "bert":  # the last layer's query from [CLS] alone
            a, b = (m(ids, types, mask, all_positions=False) for m in (fused, unfused))
            assert torch.equal(a.logits, b.logits)
        (_, ca), (_, cb) = fused.run_with_cache(ids, types, mask), unfused.run_with_cache(ids, types, mask)
    assert set(ca) == set(cb) and all(torch.equal(ca[n], cb[n]) for n in ca)
    assert memory_bytes(fused) == memory_bytes(unfused)
    assert set(fused.state_dict()) < set(unfused.state_dict())  # only the int8 weights' packed copies differ


@pytest.mark.parametrize("model_type, extra", [
    ("distilbert", {}), ("roberta", {"position_offset": 2, "pad_token_id": 1}),
    ("albert", {"embedding_size": 16, "extra": {"embedding_size": 16}}),
])
def test_every_family_reloads_its_compressed_folder_exactly(tmp_path, model_type, extra):
    model = tiny(model_type, **extra)
    ids, types, mask = batch()
    if model_type == "albert":  # one layer shared across depth: no per-layer heads to prune
        with pytest.raises(CompressError, match="shared across depth"):
            prune_heads(copy.deepcopy(model), {0: [1]})
        small = quantize(model)
    else:
        small = quantize(prune_heads(copy.deepcopy(model), {0: [1], 1: [0, 2]}))
    again, _ = bertlab.loading.load_model(save_compressed(small, None, tmp_path / model_type))
    with torch.no_grad():
        assert torch.equal(small(ids, types, mask).logits, again(ids, types, mask).logits)
    assert heads_per_layer(again) == heads_per_layer(small)


def test_a_damaged_compressed_folder_is_refused_in_one_message(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_compressed(quantize(tiny()), None, tmp_path / "q")
    state = load_file(str(folder / "model.safetensors"))
    del state["bert.encoder.layer.1.output.dense.weight_scale"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"output\.dense\.weight should be int8 with a .*_scale row"):
        bertlab.loading.load_model(folder)


# ---------------------------------------------------------------------------------------------
# Distillation
# ---------------------------------------------------------------------------------------------
def test_the_student_starts_from_every_other_teacher_layer():
    assert student_layers(6, 3) == [0, 2, 4] and student_layers(12, 6) == [0, 2, 4, 6, 8, 10]
    teacher = tiny(layers=4)
    student = make_student(teacher, 2)
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    t, s = teacher.state_dict(), student.state_dict()
    layer = teacher.family.layer_prefix
    for key in s:
        j = student.family.layer_of(key)
        src = key if j is None else layer([0, 2][j]) + key[len(layer(j)):]
        assert torch.equal(s[key], t[src]), key


@pytest.mark.parametrize("hidden_weight", [0.0, 1.0])
def test_distillation_brings_the_student_nearer_the_teacher(sst2, tok, hidden_weight):
    teacher = tiny(layers=4, seed=3, initializer_range=0.3)  # large weights: every layer changes the answer
    data = TaskData.read("sst2", tok, teacher, data=str(sst2))
    batches = data.batches(tok, teacher, 64, batch_size=32)
    before = soft_loss_on(make_student(teacher, 2), teacher, batches)
    cfg = DistillConfig(task="sst2", layers=2, epochs=3, lr=1e-3, batch_size=16, max_length=16, alpha=1.0,
                        hidden_weight=hidden_weight, device="cpu", log_every=1, warmup_ratio=0.0)
    result = distill(teacher, tok, cfg, train_examples=data.train[:64], eval_examples=data.dev)
    assert result.status == "completed" and result.student.config.num_hidden_layers == 2
    after = soft_loss_on(result.student, teacher, batches)
    assert after < 0.7 * before, (before, after)
    assert set(result.metrics) >= {"accuracy"} and "accuracy" in result.teacher_metrics
    assert all(p.requires_grad for p in teacher.parameters())  # the teacher is given back as it was
    with pytest.raises(CompressError, match="distil from a float teacher"):
        make_student(quantize(teacher), 2)


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------
def test_bertlab_compress_writes_folders_that_load_and_evaluate(tmp_path, sst2, tok, capsys):
    model = tiny(vocab=tok.vocab_size)
    save_pretrained(model, tok, tmp_path / "m")
    data = ["--data", str(sst2), "--reps", "1", "--no-progress"]
    assert main(["compress", "quantize", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "q")]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["disk_mb"] < 0.4 * line["original_disk_mb"]
    assert main(["compress", "prune", "--model", str(tmp_path / "m"), "--task", "sst2", "--keep", "0.5",
                 "--importance-examples", "32", "--out", str(tmp_path / "p"), *data]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["result"]["heads"] == 4 and [p["heads_kept"] for p in line["curve"]][0] == 8
    assert main(["compress", "distill", "--model", str(tmp_path / "m"), "--layers", "1", "--task", "sst2",
                 "--epochs", "1", "--batch-size", "32", "--max-train-examples", "64", "--out", str(tmp_path / "s"),
                 *data]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["result"]["layers"] == 1 and line["student"] is not None
    for folder in ("q", "p", "s"):
        assert main(["evaluate", "--task", "sst2", "--model", str(tmp_path / folder), "--data", str(sst2)]) == 0
        assert 0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1
    assert main(["compress", "prune", "--model", str(tmp_path / "m"), "--task", "sst2", "--keep", "1.5",
                 "--out", str(tmp_path / "x"), *data]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertlab compress prune: keep must leave between 1 and 8 heads") and "\n" not in err


def test_an_untied_decoder_survives_quantization_and_reload(tmp_path):
    """tie_word_embeddings false: the MLM decoder has its own weight, which the folder must keep."""
    from tiny_models import _transformers, wordpiece

    T, tok = _transformers(), wordpiece()
    torch.manual_seed(3)
    hf = T.BertForMaskedLM(T.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=40,
                                        tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.get_output_embeddings().weight.normal_(0, 0.5)
    hf.save_pretrained(tmp_path / "untied")
    model, _ = bertlab.loading.load_model(tmp_path / "untied")
    small = quantize(model)
    again, _ = bertlab.loading.load_model(save_compressed(small, None, tmp_path / "int8"))
    ids, types, mask = batch()
    ids = ids % len(tok)
    with torch.no_grad():
        assert torch.equal(small(ids, types, mask).mlm_logits, again(ids, types, mask).mlm_logits)


def test_latency_is_timed_on_inputs_the_model_can_read(tok):
    """A model that reads fewer tokens than the timing sentences have (a tiny one, 16 positions) is timed on
    sentences cut to its limit, not refused."""
    from bertlab.compress.measure import measure
    from bertlab.families.bert import Bert

    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16)
    model = Bert(cfg).eval()
    long = " ".join(["the cat sat on the mat"] * 10)
    row = measure(model, tok, "tiny", "fp32", [long], reps=2, batch_sizes=(1, 2))
    assert row.latency_ms_b1 > 0
