"""ModernBERT equals Hugging Face transformers (fp32, <= 1e-5) on tiny random checkpoints written by
transformers here: hidden states, every attention pattern (inputs longer than the local window, so the
band shows), MLM and classification logits, on the eager and the fast (SDPA) path, padded batches
included; config.json in transformers 5's spelling (rope_parameters, layer_types) and in the hub's
(global/local_rope_theta, global_attn_every_n_layers). Its tokenizer (byte-level BPE with BERT's
special tokens, trained here with `tokenizers`) equals transformers' fast tokenizer. The hub entries
download from a Hugging Face-compatible server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from fake_hub import FakeHub
from tiny_models import CORPUS, TOKENIZER_TEXTS, max_diff, save_wide
from tiny_models import _transformers as _hf

from bertlab.families import LAYER_HOOKS
from bertlab.loading import load, load_model, save_pretrained
from bertlab.tokenizer import Tokenizer
from bertlab.weights import CheckpointError

TOL = 1e-5
WINDOW = 4  # local_attention: each token of a local layer sees 2 on each side
SIZE = dict(hidden_size=32, num_hidden_layers=5, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=96, local_attention=WINDOW, global_attn_every_n_layers=2)
ARCHS = ["ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
         "ModernBertForSequenceClassification-mean", "ModernBertForTokenClassification",
         "ModernBertForQuestionAnswering"]
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank today.",
         "Café, naïve, résumé: accents are part of the language, and so are 😀 emoji.",
         "Short one."]
TOKENIZER_TEXTS = [*TOKENIZER_TEXTS,
                   "Visit https://huggingface.co/answerdotai/ModernBERT-base or mail me@example.com.",
                   "The capital of France is [MASK]."]


def modernbert_tokenizer():
    """ModernBERT's kind of tokenizer, trained on CORPUS: byte-level BPE, BERT's special tokens
    ([MASK] swallowing the space before it, as in ModernBERT's tokenizer.json), [CLS] A [SEP] B [SEP]."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as RustTokenizer

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False, special=True)])
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return _hf().PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])


def write_checkpoint(folder, arch: str, tok, seed: int = 0, **changes):
    """A tiny random ModernBERT of `arch` ("-mean": mean pooling) written by transformers, with weights
    drawn wide enough that every pattern is sharp (the band and the rotation matter), and `tok`."""
    T = _hf()
    torch.manual_seed(seed)
    name, _, pooling = arch.partition("-")
    cfg = T.ModernBertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                             sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                             eos_token_id=tok.sep_token_id, classifier_pooling=pooling or "cls",
                             num_labels=2 if name.endswith("Answering") else 3, **{**SIZE, **changes})
    model = getattr(T, name)(cfg).eval()
    return save_wide(model, tok, folder)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mb-tok")
    modernbert_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_tok(tokenizer_folder):
    return _hf().AutoTokenizer.from_pretrained(tokenizer_folder)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, hf_tok):
    root = tmp_path_factory.mktemp("modernbert")
    return {arch: write_checkpoint(root / arch, arch, hf_tok, seed=i) for i, arch in enumerate(ARCHS)}


def _batch(tok: Tokenizer):
    batch = tok.encode_batch(TEXTS)
    assert batch.input_ids.shape[1] > 4 * WINDOW and not bool(batch.attention_mask.all())  # long, and padded
    return batch.input_ids, batch.attention_mask




FIELDS = {"ModernBertModel": [("last_hidden_state", "last_hidden_state", True)],
          "ModernBertForMaskedLM": [("mlm_logits", "logits", True)],
          "ModernBertForSequenceClassification": [("logits", "logits", False)],
          "ModernBertForTokenClassification": [("logits", "logits", True)],
          "ModernBertForQuestionAnswering": [("start_logits", "start_logits", True),
                                             ("end_logits", "end_logits", True)]}


def compare(model, hf, arch: str, ids, mask, path: str) -> dict[str, float]:
    """Max abs differences to transformers by what is compared (each asserted <= TOL); padded
    positions are left out of per-token outputs, never out of the patterns."""
    fam = model.family
    model.set_attn_implementation(path)
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    if path == "eager":
        names += fam.layer_hook_names("hook_pattern")
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, None, mask, names=names)
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=path == "eager")
    diffs = {"embeddings": max_diff(cache[fam.embedding_hook], ref.hidden_states[0], mask)}
    assert len(ref.hidden_states) == fam.num_layers + 1
    diffs["hidden states"] = max(max_diff(cache[fam.hook_name(i, "hook_resid_post")], ref.hidden_states[i + 1], mask)
                                 for i in range(fam.num_layers))
    if path == "eager":
        assert len(ref.attentions) == fam.num_layers
        diffs["patterns"] = max(max_diff(cache[fam.hook_name(i, "hook_pattern")], a)
                                for i, a in enumerate(ref.attentions))
    for ours, theirs, per_token in FIELDS[arch.partition("-")[0]]:
        diffs[ours] = max_diff(getattr(out, ours), getattr(ref, theirs), mask if per_token else None)
    assert all(v <= TOL for v in diffs.values()), (arch, path, diffs)
    return diffs


@pytest.mark.parametrize("path", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_modernbert_equals_transformers(checkpoints, arch, path):
    model, tok = load(str(checkpoints[arch]))
    assert model.family.name == "modernbert" and model.config.model_type == "modernbert"
    hf = getattr(_hf(), arch.partition("-")[0]).from_pretrained(checkpoints[arch], attn_implementation=path).eval()
    ids, mask = _batch(tok)
    compare(model, hf, arch, ids, mask, path)


def test_local_layers_see_a_band_and_global_layers_everything(checkpoints):
    """Layers 0, 2, 4 are global, 1 and 3 local: a local layer's pattern is zero more than
    local_attention / 2 tokens away (for real queries), a global one is not."""
    model, tok = load(str(checkpoints["ModernBertForMaskedLM"]))
    ids, mask = _batch(tok)
    fam = model.family
    _, cache = model.run_with_cache(ids, None, mask, names=fam.layer_hook_names("hook_pattern"))
    assert [layer.attn.kind for layer in model.model.layers] == ["global", "local", "global", "local", "global"]
    pos = torch.arange(ids.shape[1])
    far = (pos[:, None] - pos[None, :]).abs() > WINDOW // 2  # [query, key]
    real = mask[0].bool()  # the longest text: no padding
    for i in range(fam.num_layers):
        pattern = cache[fam.hook_name(i, "hook_pattern")][0]  # [head, query, key]
        outside = pattern[:, real][:, :, real][:, far[real][:, real]]
        if i % 2:
            assert float(outside.abs().max()) == 0.0, i
        else:
            assert float(outside.max()) > 1e-3, i
    # and padding is never read, in either kind of layer
    short = ~mask[2].bool()
    assert all(float(cache[fam.hook_name(i, "hook_pattern")][2][:, mask[2].bool()][:, :, short].max()) == 0.0
               for i in range(fam.num_layers))


def test_the_comparison_sees_the_rotation_the_window_and_the_pooling(checkpoints, tmp_path):
    """The same weights read with another local theta, another window or another pooling give other
    numbers: the equality above is not blind to them."""
    import shutil

    T = _hf()
    base = checkpoints["ModernBertForSequenceClassification"]
    ids, mask = _batch(load(str(base))[1])
    ref = T.ModernBertForSequenceClassification.from_pretrained(base, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for change in ({"rope_parameters": {"full_attention": {"rope_theta": 160000.0, "rope_type": "default"},
                                        "sliding_attention": {"rope_theta": 20.0, "rope_type": "default"}}},
                   {"local_attention": 8}, {"classifier_pooling": "mean"},
                   {"layer_types": ["full_attention"] * 5}):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(base, folder)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        model, _ = load_model(folder)
        with torch.no_grad():
            out = model(ids, None, mask)
        assert max_diff(out.logits, want.logits) > 1e-3, change


@pytest.mark.parametrize("thetas", [(500.0, 30.0), None])
def test_the_hubs_older_config_spelling_equals_transformers(tmp_path, hf_tok, thetas):
    """global_rope_theta / local_rope_theta / global_attn_every_n_layers (what hub checkpoints carry),
    with thetas unlike the defaults (or none: transformers' defaults), every third layer global;
    transformers reads the same file."""
    folder = write_checkpoint(tmp_path / "old", "ModernBertForMaskedLM", hf_tok, seed=5)
    cfg = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        cfg.pop(key)
    cfg.update(global_attn_every_n_layers=3)
    if thetas:
        cfg.update(global_rope_theta=thetas[0], local_rope_theta=thetas[1])
    (folder / "config.json").write_text(json.dumps(cfg))
    model, tok = load(str(folder))
    assert [layer.attn.kind for layer in model.model.layers] == ["global", "local", "local", "global", "local"]
    ids, mask = _batch(tok)
    for path in ("eager", "sdpa"):
        hf = _hf().ModernBertForMaskedLM.from_pretrained(folder, attn_implementation=path).eval()
        assert hf.config.rope_parameters["sliding_attention"]["rope_theta"] == (thetas[1] if thetas else 10000.0)
        compare(model, hf, "ModernBertForMaskedLM", ids, mask, path)


@pytest.mark.parametrize("arch", ["ModernBertForMaskedLM", "ModernBertForSequenceClassification-mean",
                                  "ModernBertForQuestionAnswering", "ModernBertModel"])
def test_bertlab_save_reads_back_in_transformers(checkpoints, tmp_path, arch):
    model, tok = load(str(checkpoints[arch]))
    save_pretrained(model, tok, tmp_path / "saved")
    T = _hf()
    cls = getattr(T, arch.partition("-")[0])
    back = cls.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    original = cls.from_pretrained(checkpoints[arch]).eval()
    ours, theirs = back.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids, mask = _batch(tok)
    compare(model, back, arch, ids, mask, "eager")
    again, tok_again = load(str(tmp_path / "saved"))
    assert again.config.pretraining_heads == model.config.pretraining_heads
    assert tok_again.encode(TEXTS[0]).ids == tok.encode(TEXTS[0]).ids


def test_untied_decoder_loads_and_equals_transformers(tmp_path, hf_tok):
    folder = write_checkpoint(tmp_path / "untied", "ModernBertForMaskedLM", hf_tok, seed=9, tie_word_embeddings=False)
    model, tok = load(str(folder))
    assert isinstance(model.decoder, torch.nn.Linear)
    ids, mask = _batch(tok)
    hf = _hf().ModernBertForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert hf.decoder.weight.data_ptr() != hf.model.embeddings.tok_embeddings.weight.data_ptr()
    compare(model, hf, "ModernBertForMaskedLM", ids, mask, "eager")


def test_hook_points_protocol_and_modernbert_own(checkpoints):
    """Every protocol hook in every layer; q and k after the rotation; GeGLU's halves and gate;
    the embeddings' parts (no segment, no position part)."""
    import torch.nn.functional as F

    model, tok = load(str(checkpoints["ModernBertForMaskedLM"]))
    fam = model.family
    for i in range(fam.num_layers):
        for short in (*LAYER_HOOKS, "hook_rot_q", "hook_rot_k", "hook_pre", "hook_gate", "hook_linear"):
            assert fam.hook_name(i, short) in model.hook_points, (i, short)
    ids, mask = _batch(tok)
    names = [fam.hook_name(1, s) for s in ("hook_q", "hook_rot_q", "hook_k", "hook_rot_k", "hook_pre", "hook_gate",
                                           "hook_linear", "hook_post", "hook_result", "hook_attn_out")]
    parts = [fam.embedding_part_hook(s) for s in ("hook_word", "hook_token_type", "hook_position", "hook_out")]
    _, cache = model.run_with_cache(ids, None, mask, names=names + parts)
    q, rot_q = cache[names[0]], cache[names[1]]
    assert q.shape == rot_q.shape == (3, ids.shape[1], 4, 8)
    assert torch.allclose(q[:, 0], rot_q[:, 0]) and not torch.allclose(q[:, 5], rot_q[:, 5])  # position 0: no turn
    assert torch.allclose(q.norm(dim=-1), rot_q.norm(dim=-1), atol=1e-5)  # a rotation keeps lengths
    assert torch.allclose(cache[names[5]], F.gelu(cache[names[4]]))
    assert torch.allclose(cache[names[7]], cache[names[5]] * cache[names[6]])
    assert cache[names[8]].shape == (3, ids.shape[1], 4, 32)
    assert torch.allclose(cache[names[8]].sum(2), cache[names[9]], atol=1e-5)  # Wo has no bias
    assert parts[0] in cache and parts[3] in cache and parts[1] not in cache and parts[2] not in cache
    assert not fam.has_segments
    assert model.family.embeddings(model).word_embeddings is model.model.embeddings.tok_embeddings
    # the last layer's output is the encoder's (final_norm'ed, as transformers' last hidden state); the
    # stream before the norm has its own hook
    last = fam.hook_name(fam.num_layers - 1, "hook_resid_post")
    out, cache = model.run_with_cache(ids, None, mask, names=[last, "model.hook_resid_final"])
    assert torch.equal(cache[last], out.last_hidden_state)
    assert torch.allclose(model.model.final_norm(cache["model.hook_resid_final"]), cache[last])
    assert cache["model.hook_resid_final"].norm() > 2 * cache[last].norm()


def test_pruned_and_quantized_modernbert_equal_their_references_and_reload(checkpoints, tmp_path):
    """Pruning cuts a head's rows out of the fused Wqkv (in q, k and v) and its columns out of Wo: the
    same numbers as switching the head off; the int8 copy saved and read back gives its own numbers."""
    import copy

    from bertlab.compress.quantize import quantize
    from bertlab.compressed.storage import save_compressed
    from bertlab.compressed.structure import heads_per_layer, prune_heads

    model, tok = load(str(checkpoints["ModernBertForSequenceClassification"]))
    ids, mask = _batch(tok)
    gone = {0: [1, 3], 1: [0]}
    head_mask = torch.ones(5, 4)
    for layer, heads in gone.items():
        head_mask[layer, heads] = 0
    with torch.no_grad():
        ref = model(ids, None, mask, head_mask=head_mask)
        small = prune_heads(copy.deepcopy(model), gone)
        out = small(ids, None, mask)
    assert heads_per_layer(small) == [2, 3, 4, 4, 4]
    assert small.model.layers[0].attn.Wqkv.weight.shape == (3 * 2 * 8, 32)
    assert max_diff(out.logits, ref.logits) <= TOL
    assert max_diff(out.last_hidden_state, ref.last_hidden_state, mask) <= TOL
    int8 = quantize(small)
    again, _ = load_model(save_compressed(int8, None, tmp_path / "int8"))
    with torch.no_grad():
        assert torch.equal(int8(ids, None, mask).logits, again(ids, None, mask).logits)
        assert max_diff(int8(ids, None, mask).logits, out.logits) < 0.5  # int8 stays near the float model


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types must list"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "rope_type 'linear'"),
    ({"classifier_pooling": "max"}, "classifier_pooling must be 'cls' or 'mean'"),
    ({"local_attention": "wide"}, "local_attention must be a whole number"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
])
def test_configs_bertlab_cannot_build_are_refused_by_name(checkpoints, tmp_path, change, message):
    import shutil

    folder = tmp_path / "c"
    shutil.copytree(checkpoints["ModernBertModel"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError) as e:
        load_model(folder)
    assert str(folder / "config.json") in str(e.value) and message in str(e.value)


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------
def _same(ours, ref, tag):
    assert ours.ids == ref["input_ids"], tag
    assert ours.tokens == ref.tokens(), tag
    assert [tuple(o) for o in ours.offsets] == [tuple(o) for o in ref["offset_mapping"]], tag
    assert ours.word_ids == ref.word_ids(), tag
    assert ours.sequence_ids == ref.sequence_ids(), tag


def test_tokenizer_equals_transformers(tokenizer_folder, hf_tok, tmp_path):
    ours = Tokenizer.from_folder(tokenizer_folder)
    assert ours.special_tokens == {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"}
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.unk_token_id, ours.mask_token_id) == (
        hf_tok.cls_token_id, hf_tok.sep_token_id, hf_tok.pad_token_id, hf_tok.unk_token_id, hf_tok.mask_token_id)
    assert ours.vocab_size == len(hf_tok) and not ours.is_wordpiece
    for text in TOKENIZER_TEXTS:
        _same(ours.encode(text), hf_tok(text, return_offsets_mapping=True), text)
    for a, b in [("Where is the fox?", "It jumps over the dog."), ("東京", "Tokyo 🇯🇵")]:
        _same(ours.encode(a, b), hf_tok(a, b, return_offsets_mapping=True), (a, b))
    masked = ours.encode("The capital of France is [MASK].")
    assert masked.ids.count(ours.mask_token_id) == 1  # the space before [MASK] goes with it, as in HF
    long = " ".join(CORPUS[:8] * 12)
    _same(ours.encode(long, max_length=10_000), hf_tok(long, return_offsets_mapping=True), "long")
    cut = ours.encode(long, max_length=512)
    _same(cut, hf_tok(long, truncation=True, max_length=512, return_offsets_mapping=True), "cut")
    ours.save(tmp_path)
    back = _hf().AutoTokenizer.from_pretrained(tmp_path)
    for text in TOKENIZER_TEXTS:
        assert back(text)["input_ids"] == ours.encode(text).ids == Tokenizer.from_folder(tmp_path).encode(text).ids


def test_fill_mask_end_to_end_equals_transformers(checkpoints, hf_tok):
    """load() gives the model and its tokenizer; the lab's mask prediction reads the same logits as
    transformers' ModernBertForMaskedLM on the same text."""
    from bertlab.analysis.ablation import masked_log_probs, masked_query

    folder = checkpoints["ModernBertForMaskedLM"]
    model, tok = load(str(folder))
    text = "The quick brown fox [MASK] over the lazy dog near the river bank."
    query = masked_query(model, tok, text)
    hf = _hf().ModernBertForMaskedLM.from_pretrained(folder).eval()
    enc = hf_tok(text, return_tensors="pt")
    assert query.input_ids[0].tolist() == enc["input_ids"][0].tolist()
    with torch.no_grad():
        want = hf(**enc).logits[0, query.position].log_softmax(-1)
    assert max_diff(masked_log_probs(model, query)[0], want) <= TOL


# ---------------------------------------------------------------------------------------------
# The hub: recommended, downloaded from a Hugging Face-compatible server on loopback
# ---------------------------------------------------------------------------------------------
HUB_NAMES = ("answerdotai/ModernBERT-base", "jhu-clsp/ettin-encoder-17m")


def test_modernbert_members_are_recommended():
    from bertlab.hub import RECOMMENDED

    names = [m.name for m in RECOMMENDED]
    assert all(name in names for name in HUB_NAMES)


def test_download_then_load_offline(tmp_path, hf_tok):
    """`bertlab download` of both names from the loopback hub (tiny stand-ins under the real names),
    then `bertlab.load(name)` offline gives the same logits as the folder it was made from."""
    folders = {name: write_checkpoint(tmp_path / name.split("/")[1], "ModernBertForMaskedLM", hf_tok, seed=i)
               for i, name in enumerate(HUB_NAMES)}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", HF_HUB_DISABLE_TELEMETRY="1")
    code = "import sys; from bertlab.cli import main; sys.exit(main(sys.argv[1:]))"
    with FakeHub(folders) as hub:
        done = subprocess.run([sys.executable, "-c", code, "download", *HUB_NAMES],
                              env={**env, "HF_ENDPOINT": hub.endpoint}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = ("import json, sys, torch, bertlab; m, t = bertlab.load(sys.argv[1]); e = t.encode('the quick [MASK] fox');"
             "print(json.dumps([m.family.name, m(torch.tensor([e.ids])).mlm_logits[0, 3, :5].tolist()]))")
    for name, folder in folders.items():
        run = subprocess.run([sys.executable, "-c", probe, name], env={**env, "HF_HUB_OFFLINE": "1"},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-800:]
        family, logits = json.loads(run.stdout.strip().splitlines()[-1])
        model, tok = load(str(folder))
        ref = model(torch.tensor([tok.encode("the quick [MASK] fox").ids])).mlm_logits[0, 3, :5]
        assert family == "modernbert"
        torch.testing.assert_close(torch.tensor(logits), ref, atol=1e-5, rtol=0)


def test_feature_mode_trains_the_task_head_before_the_classifier(checkpoints):
    """ModernBERT's classifier reads `head` (dense -> activation -> norm) first: feature mode trains both."""
    from bertlab.training.finetune import set_trainable

    model, _ = load_model(checkpoints["ModernBertForSequenceClassification"])
    assert model.family.task_head_prefixes == ("head.", "classifier.")
    trainable, _ = set_trainable(model, "feature")
    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert learning == {"head.dense.weight", "head.norm.weight", "classifier.weight", "classifier.bias"}
    assert trainable == 32 * 32 + 32 + 3 * 32 + 3


def test_logit_lens_reads_every_stage_through_final_norm(checkpoints):
    """Pre-norm: the lens at stage s (after layer s - 1) equals the MLM logits of the model cut to its first
    s layers (whose last layer's stream goes through `final_norm`, as the head expects); the last stage is
    the model's own MLM output."""
    import copy

    from bertlab.analysis.ablation import logit_lens

    model, tok = load(checkpoints["ModernBertForMaskedLM"])
    text = "The quick brown fox [MASK] over the lazy dog near the river bank today."
    lens = logit_lens(model, tok, text, k=5)
    ids, pos = lens.query.input_ids, lens.query.position
    for s in range(1, model.config.num_hidden_layers + 1):
        cut = copy.deepcopy(model)
        cut.model.layers = cut.model.layers[:s]
        with torch.no_grad():
            log_probs = cut(ids).mlm_logits[0, pos].log_softmax(-1)  # [vocab]
        assert abs(float(log_probs[lens.query.target_id]) - float(lens.target_log_probs[s])) < 1e-4, s
        assert log_probs.topk(5).indices.tolist() == lens.top_ids[s].tolist(), s


def test_parameter_bars_show_no_position_parameters_and_the_norms_apart(checkpoints):
    """Rotary positions have no parameters; the embeddings' norm and final_norm sit outside the layers."""
    from bertlab.analysis.family import parameter_count

    model, _ = load_model(checkpoints["ModernBertForMaskedLM"])
    count = parameter_count(model)
    assert count.total == sum(p.numel() for p in model.parameters())
    assert count.parts["position + segment embeddings"] == 0
    assert count.parts["norms outside the layers"] == 2 * 32  # two bias-free norms
    assert count.parts["encoder layers"] == sum(p.numel() for p in model.model.layers.parameters())
    assert count.parts["word embeddings"] == model.model.embeddings.tok_embeddings.weight.numel()


def test_adapter_mode_trains_modernberts_norms(checkpoints):
    """Adapter mode trains every LayerNorm of the encoder: ModernBERT's are attn_norm, mlp_norm, final_norm."""
    from bertlab.training.finetune import is_trainable

    model, _ = load_model(checkpoints["ModernBertForSequenceClassification"])
    fam = model.family
    norms = [n for n, _ in model.named_parameters() if n.startswith("model.") and n.endswith("norm.weight")]
    assert {"model.layers.1.attn_norm.weight", "model.layers.0.mlp_norm.weight", "model.final_norm.weight",
            "model.embeddings.norm.weight"} <= set(norms)
    assert all(is_trainable(n, "adapter", fam) for n in norms)
    assert not is_trainable("model.layers.1.attn.Wqkv.weight", "adapter", fam)
    assert not is_trainable("model.layers.1.attn_norm.weight", "feature", fam)
