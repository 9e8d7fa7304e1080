"""DeBERTa-v2/v3 equals Hugging Face transformers (fp32, <= 1e-5): hidden states, every attention pattern,
the MLM, classification, token and span logits, on the eager path and the fast (SDPA) path; a v3-style
config (relative positions only, log buckets, shared attention keys, no segments) and a v2-style one
(absolute positions too, segments, separate position projections, the ConvLayer); the three score terms
add up to the scores; bertlab's save reads back in transformers; the SentencePiece Unigram tokenizer
equals transformers' DebertaV2Tokenizer. Checkpoints and tokenizers are written in the test."""

from __future__ import annotations

import pytest
import torch
from tiny_models import CORPUS, deberta_detector, deberta_detector_logits, pruned_and_masked, sentencepiece_folder

from bertlab.compressed.structure import heads_per_layer
from bertlab.families import FAMILIES, LAYER_HOOKS
from bertlab.loading import load, load_model, save_pretrained
from bertlab.tokenizer import Tokenizer

TOL = 1e-5
SMALL = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64, hidden_act="gelu")
VARIANTS = {
    # DeBERTa-v3: relative positions only, 256-style buckets (here 8), shared keys, no segments
    "v3": dict(**SMALL, relative_attention=True, position_buckets=8, max_relative_positions=-1,
               norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
               position_biased_input=False, type_vocab_size=0),
    # DeBERTa-v2 style: absolute positions added to the input, segments, own position projections, conv
    "v2-conv": dict(**SMALL, relative_attention=True, position_buckets=-1, max_relative_positions=12,
                    share_att_key=False, pos_att_type="c2p|p2c", position_biased_input=True, type_vocab_size=2,
                    conv_kernel_size=3, conv_act="gelu"),
    # the MLM head under DeBERTa's own names (transformers' legacy=False, the hub checkpoints' layout)
    "v3-lm-head": dict(**SMALL, relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm",
                       share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                       type_vocab_size=0, legacy=False),
}
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
CASES = [(v, h) for v in ("v3", "v2-conv") for h in HEADS] + [("v3-lm-head", "ForMaskedLM")]
FIELDS = {  # bertlab field, transformers field, per token?
    "Model": [("last_hidden_state", "last_hidden_state", True)],
    "ForMaskedLM": [("mlm_logits", "logits", True)],
    "ForSequenceClassification": [("logits", "logits", False)],
    "ForTokenClassification": [("logits", "logits", True)],
    "ForQuestionAnswering": [("start_logits", "start_logits", True), ("end_logits", "end_logits", True)],
}
SEQ = 40  # past the 8 buckets' exact range (+-4) and past the v2 variant's max_relative_positions


def _hf():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny random DeBERTa-v2 checkpoints written by transformers' save_pretrained: (variant, head) -> folder."""
    T = _hf()
    root = tmp_path_factory.mktemp("deberta")
    out = {}
    for i, (variant, head) in enumerate(CASES):
        torch.manual_seed(i)
        cfg = T.DebertaV2Config(**VARIANTS[variant], num_labels=2 if head.endswith("Answering") else 3)
        model = getattr(T, "DebertaV2" + head)(cfg).eval()
        folder = root / f"{variant}-{head}"
        model.save_pretrained(folder)
        out[variant, head] = folder
    return out


def _batch(seed=0, types=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, SMALL["vocab_size"], (3, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 6:] = 0
    segments = torch.zeros_like(ids)
    if types:
        segments[:, 20:] = 1
    return ids, segments, mask


def _diff(a, b, mask=None) -> float:
    d = (a - b).detach().abs()
    if mask is not None:
        d = d[mask.bool()]
    return float(d.max())


def _compare(model, hf, head, path, seed=0) -> dict[str, float]:
    """Max abs differences with transformers, by what was compared; asserts each is within TOL."""
    ids, types, mask = _batch(seed, types=model.config.type_vocab_size > 0)
    fam = model.family
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    if path == "eager":
        names += fam.layer_hook_names("hook_pattern")
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, types, mask, names=names)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True,
                 output_attentions=path == "eager")
    diffs: dict[str, float] = {}
    hidden = ref.hidden_states
    assert len(hidden) == fam.num_layers + 1
    diffs["embeddings"] = _diff(cache[fam.embedding_hook], hidden[0], mask)
    for i in range(fam.num_layers):
        diffs[f"hidden {i + 1}"] = _diff(cache[fam.hook_name(i, "hook_resid_post")], hidden[i + 1], mask)
        if path == "eager":  # every pattern, padding rows included
            diffs[f"pattern {i}"] = _diff(cache[fam.hook_name(i, "hook_pattern")], ref.attentions[i])
    for ours, theirs, per_token in FIELDS[head]:
        diffs[ours] = _diff(getattr(out, ours), getattr(ref, theirs), mask if per_token else None)
    for what, d in diffs.items():
        assert d <= TOL, (head, path, what, d)
    return diffs


@pytest.mark.parametrize("path", ["eager", "sdpa"])
@pytest.mark.parametrize("variant,head", CASES)
def test_deberta_equals_transformers(checkpoints, variant, head, path):
    model, _ = load_model(checkpoints[variant, head])
    assert model.family.name == "deberta-v2" and model.family.prefix == "deberta"
    assert model.family.has_segments == (variant == "v2-conv")
    model.set_attn_implementation(path)
    hf = getattr(_hf(), "DebertaV2" + head).from_pretrained(checkpoints[variant, head],
                                                            attn_implementation="eager").eval()
    _compare(model, hf, head, path)


def test_the_comparison_can_fail(checkpoints):
    """A model whose relative-position table is nudged no longer equals transformers."""
    model, _ = load_model(checkpoints["v3", "ForMaskedLM"])
    hf = _hf().DebertaV2ForMaskedLM.from_pretrained(checkpoints["v3", "ForMaskedLM"]).eval()
    with torch.no_grad():
        model.deberta.encoder.rel_embeddings.weight[9, 0] += 0.5  # one entry: a whole row is undone by the LayerNorm
    with pytest.raises(AssertionError):
        _compare(model, hf, "ForMaskedLM", "eager")


@pytest.mark.parametrize("variant", ["v3", "v2-conv"])
def test_score_terms_add_up_and_differ(checkpoints, variant):
    """hook_c2c + hook_c2p + hook_p2c (+ the padding mask) are hook_scores; each term carries its own signal."""
    model, _ = load_model(checkpoints[variant, "Model"])
    fam = model.family
    ids, types, _ = _batch(types=model.config.type_vocab_size > 0)
    terms = ("hook_c2c", "hook_c2p", "hook_p2c", "hook_scores")
    names = [fam.hook_name(i, t) for i in range(fam.num_layers) for t in terms]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, types, torch.ones_like(ids), names=names)
    for i in range(fam.num_layers):
        c2c, c2p, p2c, scores = (cache[fam.hook_name(i, t)] for t in terms)
        assert c2c.shape == c2p.shape == p2c.shape == (3, 4, SEQ, SEQ)
        assert _diff(c2c + c2p + p2c, scores) <= 1e-6
        assert min(float(t.abs().max()) for t in (c2c, c2p, p2c)) > 1e-5
        assert not torch.allclose(c2p, p2c)


def test_protocol_hooks_and_what_a_v3_model_lacks(checkpoints):
    model, _ = load_model(checkpoints["v3", "ForMaskedLM"])
    fam = model.family
    for i in range(fam.num_layers):
        for short in LAYER_HOOKS:
            assert fam.hook_name(i, short) in model.hook_points, (i, short)
    names = model.hook_names()
    assert "deberta.encoder.layer.1.attention.self.hook_p2c" in names
    state = model.state_dict()
    assert not any("position_embeddings" in k or "token_type_embeddings" in k for k in state)
    assert state["deberta.encoder.rel_embeddings.weight"].shape == (16, 32)  # 2 x position_buckets
    ids, types, mask = _batch(types=False)
    types[:, 20:] = 1  # a pair's segment ids, as the tokenizer gives them: read by no v3 weight
    with torch.no_grad():
        a = model(ids, types, mask).mlm_logits
        b = model(ids, torch.zeros_like(ids), mask).mlm_logits
    assert torch.equal(a, b)
    assert FAMILIES["deberta-v2"].holds_head("mlm", {"lm_predictions.lm_head.dense.weight": None})


def test_the_sentence_pooler_belongs_to_the_head(checkpoints):
    """DeBERTa's ContextPooler sits outside the encoder (`pooler.dense`): feature-mode fine-tuning trains it."""
    from bertlab.training.finetune import set_trainable

    model, _ = load_model(checkpoints["v3", "ForSequenceClassification"])
    assert model.family.pooler_prefix == "pooler."
    trainable, _ = set_trainable(model, "feature")
    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert learning == {"pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"}
    assert trainable == 32 * 32 + 32 + 3 * 32 + 3


@pytest.mark.parametrize("variant,head", [("v3", "ForMaskedLM"), ("v3-lm-head", "ForMaskedLM"),
                                          ("v2-conv", "ForSequenceClassification"),
                                          ("v3", "ForQuestionAnswering")])
def test_bertlab_save_reads_back_in_transformers(checkpoints, tmp_path, variant, head):
    model, _ = load_model(checkpoints[variant, head])
    save_pretrained(model, None, tmp_path / "saved")
    cls = getattr(_hf(), "DebertaV2" + head)
    back = cls.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    original = cls.from_pretrained(checkpoints[variant, head]).eval()
    ours, theirs = back.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k
    _compare(model, back, head, "eager", seed=3)
    again, _ = load_model(tmp_path / "saved")
    assert again.config.pretraining_heads == model.config.pretraining_heads


def test_hub_layout_loads_its_lm_head_and_its_detector(checkpoints, tmp_path):
    """A DeBERTa-v3 hub file: no architectures, no legacy flag, `lm_predictions` + `mask_predictions` keys;
    bertlab's save of it reads back in transformers' DebertaV2ForMaskedLM (the detector left unread)."""
    import json

    from safetensors.torch import load_file, save_file

    src = checkpoints["v3-lm-head", "ForMaskedLM"]
    cfg = json.loads((src / "config.json").read_text())
    for key in ("architectures", "legacy"):
        cfg.pop(key)
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    state = load_file(src / "model.safetensors")
    state.update(deberta_detector(32))
    save_file(state, folder / "model.safetensors")
    model, _ = load_model(folder)
    assert model.has_mlm and model.lm_predictions is not None and model.has_rtd
    hf = _hf().DebertaV2ForMaskedLM.from_pretrained(src).eval()
    _compare(model, hf, "ForMaskedLM", "sdpa")
    ids, _, mask = _batch(types=False)
    with torch.no_grad():
        out = model(ids, None, mask)
        ref = deberta_detector_logits(hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
                                      .hidden_states[-1], state)
    assert out.rtd_logits.shape == (3, SEQ) and _diff(out.rtd_logits, ref, mask) <= TOL
    save_pretrained(model, None, tmp_path / "saved")
    back = _hf().DebertaV2ForMaskedLM.from_pretrained(tmp_path / "saved").eval()
    assert back.config.architectures == ["DebertaV2ForMaskedLM"] and back.config.legacy is False
    _compare(model, back, "ForMaskedLM", "eager", seed=2)
    assert load_model(tmp_path / "saved")[0].config.pretraining_heads == ("mlm", "rtd")


# ---------------------------------------------------------------------------------------------
# The tokenizer: SentencePiece Unigram, tokenizer.json as transformers' DebertaV2Tokenizer writes it
# ---------------------------------------------------------------------------------------------
TEXTS = ["Hello world!", "Crème brûlée à la française — déjà vu.", "自然语言处理很有趣 and mixed with English.",
         "I ❤️ transformers 🤖🚀 (really).", "Visit https://huggingface.co/microsoft/deberta-v3-base now.",
         "  spaces   everywhere\tand\ttabs\n and lines  ", "The quick brown fox jumps over the lazy dog.",
         "Ｆｕｌｌｗｉｄｔｈ and e\u0301 combining"]
PAIRS = [("Where is the fox?", "It jumps over the dog."), ("東京", "Tokyo 🇯🇵")]
SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"}


def deberta_tokenizer(lower: bool = False, split_by_punct: bool = False):
    """A DeBERTa-v3-style Unigram tokenizer trained on CORPUS, wrapped in transformers' fast DebertaV2Tokenizer."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = RustTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")  # "▁word" pieces
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
                                      unk_token="[UNK]")
    tok.train_from_iterator(CORPUS, trainer)
    return _hf().DebertaV2TokenizerFast(tokenizer_object=tok, do_lower_case=lower, split_by_punct=split_by_punct)


@pytest.fixture(scope="module", params=["plain", "lower-punct", "older-file"])
def tokenizers_pair(request, tmp_path_factory):
    """(transformers' tokenizer read back from the folder, bertlab's from the same folder, folder).
    older-file: tokenizer.json with another pipeline (older converters wrote Strip and a " {2,}" rule, no
    template): transformers builds its class's pipeline over the file's vocabulary, and so must bertlab."""
    import json

    hf = deberta_tokenizer(lower=request.param == "lower-punct", split_by_punct=request.param == "lower-punct")
    folder = tmp_path_factory.mktemp("deberta-tok")
    hf.save_pretrained(folder)
    if request.param == "older-file":
        d = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        d["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
        d["pre_tokenizer"] = {"type": "Whitespace"}
        d["post_processor"] = None
        (folder / "tokenizer.json").write_text(json.dumps(d), encoding="utf-8")
    return _hf().AutoTokenizer.from_pretrained(folder), Tokenizer.from_folder(folder), folder


def _same(ours, ref, tag):
    assert ours.ids == ref["input_ids"], tag
    assert ours.tokens == ref.tokens(), tag
    assert ours.type_ids == ref["token_type_ids"], tag
    assert [tuple(o) for o in ours.offsets] == [tuple(o) for o in ref["offset_mapping"]], tag
    assert ours.word_ids == ref.word_ids(), tag


def test_tokenizer_equals_transformers(tokenizers_pair):
    hf, ours, _ = tokenizers_pair
    assert ours.special_tokens == SPECIALS
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.unk_token_id, ours.mask_token_id) == (
        hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.unk_token_id, hf.mask_token_id)
    for text in [*TEXTS, f"The capital of France is {ours.mask_token}."]:
        _same(ours.encode(text), hf(text, return_offsets_mapping=True), text)
    for a, b in PAIRS:
        _same(ours.encode(a, b), hf(a, b, return_offsets_mapping=True), (a, b))
    long = " ".join(CORPUS[:8] * 6)
    _same(ours.encode(long, max_length=64), hf(long, truncation=True, max_length=64, return_offsets_mapping=True),
          "cut")


def test_tokenizer_save_reads_back_in_transformers(tokenizers_pair, tmp_path):
    hf, ours, _ = tokenizers_pair
    ours.save(tmp_path)
    back = _hf().AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert back(text)["input_ids"] == ours.encode(text).ids == hf(text)["input_ids"], text


def test_checkpoint_loads_with_its_tokenizer(tokenizers_pair, tmp_path):
    """load() gives the DeBERTa model with its tokenizer; mask predictions equal transformers end to end."""
    hf_tok, _, _ = tokenizers_pair
    T = _hf()
    torch.manual_seed(0)
    cfg = T.DebertaV2Config(**{**VARIANTS["v3"], "vocab_size": len(hf_tok)})
    T.DebertaV2ForMaskedLM(cfg).save_pretrained(tmp_path / "m")
    hf_tok.save_pretrained(tmp_path / "m")
    model, tok = load(tmp_path / "m")
    assert model.family.special_tokens(tok)["mask"] == ("[MASK]", hf_tok.mask_token_id)
    a, b = f"Hello {tok.mask_token} world", "and a second sentence"
    enc = tok.encode(a, b)
    assert enc.ids == hf_tok(a, b)["input_ids"]
    ids, types = torch.tensor([enc.ids]), torch.tensor([enc.type_ids])
    with torch.no_grad():
        out = model(ids, types, torch.ones_like(ids))
        ref = T.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "m").eval()(input_ids=ids, token_type_ids=types).logits
    assert _diff(out.mlm_logits, ref) <= TOL


def test_spm_model_folder_equals_transformers(tmp_path):
    """A folder with only spm.model: transformers converts it (the [MASK] it lacks appended); so does bertlab."""
    folder = sentencepiece_folder(tmp_path / "spm")
    hf = _hf().AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_folder(folder)
    assert ours.vocab_size == len(hf) == 131 and ours.mask_token_id == hf.mask_token_id == 130
    assert ours.special_tokens == SPECIALS and ours.tokenizer_class == "DebertaV2Tokenizer"
    for text in [*TEXTS, f"The capital of France is {ours.mask_token}."]:
        _same(ours.encode(text), hf(text, return_offsets_mapping=True), text)
    for a, b in PAIRS:
        _same(ours.encode(a, b), hf(a, b, return_offsets_mapping=True), (a, b))
    ours.save(tmp_path / "saved")  # written back as tokenizer.json, which transformers reads the same
    back = _hf().AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert [back(t)["input_ids"] for t in TEXTS] == [hf(t)["input_ids"] for t in TEXTS]


def test_damaged_spm_model_is_refused(tmp_path):
    from bertlab.tokenizer import TokenizerError

    folder = sentencepiece_folder(tmp_path / "spm")
    data = (folder / "spm.model").read_bytes()
    (folder / "spm.model").write_bytes(data[: len(data) // 3])
    with pytest.raises(TokenizerError, match="spm.model|SentencePiece"):
        Tokenizer.from_folder(folder)


@pytest.mark.parametrize("variant", ["v3", "v2-conv"])
def test_parameter_bars_file_the_relative_positions_apart_from_the_layers(checkpoints, variant):
    """The Family tab's bars: rel_embeddings (with their norm) are relative-position embeddings, the
    embeddings' LayerNorm a norm outside the layers, the ConvLayer its own part; a layer is one layer."""
    from bertlab.analysis.family import parameter_count

    model, _ = load_model(checkpoints[variant, "ForMaskedLM"])
    count = parameter_count(model)
    enc = model.deberta.encoder

    def size(m):
        return sum(p.numel() for p in m.parameters()) if m is not None else 0

    assert count.total == sum(p.numel() for p in model.parameters())
    assert count.parts["relative-position embeddings"] == size(enc.rel_embeddings) + size(enc.LayerNorm) > 0
    assert count.parts["norms outside the layers"] == size(model.deberta.embeddings.LayerNorm)
    assert count.parts["convolution beside the first layer"] == size(enc.conv)
    assert count.per_layer == size(enc.layer[0]) and count.stored_layers == len(enc.layer)
    emb = model.deberta.embeddings
    assert count.parts["position + segment embeddings"] == size(emb.position_embeddings) + size(
        emb.token_type_embeddings)
    assert (count.parts["position + segment embeddings"] == 0) == (variant == "v3")


@pytest.mark.parametrize("variant", ["v3", "v2-conv"])
def test_pruned_deberta_equals_the_head_masked_model(checkpoints, variant):
    """Pruning cuts a head's rows out of query_proj, key_proj, value_proj and (without share_att_key)
    pos_key_proj / pos_query_proj, and its columns out of the output dense: the same numbers as switching
    the head off."""
    model, _ = load_model(checkpoints[variant, "ForSequenceClassification"])
    ids, types, mask = _batch(types=variant != "v3")
    gone = {0: [1, 3], 1: [0]}
    small, out, ref = pruned_and_masked(model, ids, types, mask, gone)
    assert heads_per_layer(small) == [2, 3]
    attn = small.deberta.encoder.layer[0].attention.self
    assert attn.query_proj.weight.shape == attn.value_proj.weight.shape == (2 * 8, 32)
    if variant == "v2-conv":
        assert attn.pos_key_proj.weight.shape == attn.pos_query_proj.weight.shape == (2 * 8, 32)
    assert (out.logits - ref.logits).abs().max() <= 1e-5
    keep = mask.bool()
    assert (out.last_hidden_state - ref.last_hidden_state)[keep].abs().max() <= 1e-5


def test_int8_and_replay_on_deberta(tokenizers_pair, tmp_path):
    """The compression lab's int8 copy of a DeBERTa-v3 masked LM saves, reads back with the same numbers and
    stays near the float model; the Replay view reads each snapshot (attention, cosines, the [MASK]'s guesses,
    the logit lens) through DeBERTa's own hooks."""
    from bertlab.analysis.replay import replay
    from bertlab.compress.quantize import quantize
    from bertlab.compressed.storage import save_compressed
    from bertlab.compressed.structure import is_int8_linear

    hf_tok, _, _ = tokenizers_pair
    T = _hf()
    torch.manual_seed(0)
    T.DebertaV2ForMaskedLM(T.DebertaV2Config(**{**VARIANTS["v3"], "vocab_size": len(hf_tok)})).save_pretrained(
        tmp_path / "m")
    hf_tok.save_pretrained(tmp_path / "m")
    model, tok = load(tmp_path / "m")
    enc = tok.encode(f"Hello {tok.mask_token} world")
    ids = torch.tensor([enc.ids])
    int8 = quantize(model)
    assert sum(is_int8_linear(m) for m in int8.modules()) >= 6 * model.config.num_hidden_layers
    again, _ = load_model(save_compressed(int8, tok, tmp_path / "int8"))
    with torch.no_grad():
        float_logits = model(ids, None, torch.ones_like(ids)).mlm_logits
        q = int8(ids, None, torch.ones_like(ids)).mlm_logits
        assert torch.equal(q, again(ids, None, torch.ones_like(ids)).mlm_logits)
    assert 0 < _diff(q, float_logits) < 0.5

    frames = replay([(2, int8), (0, model)], tok, f"Hello {tok.mask_token} world", k=3)
    assert [f.step for f in frames.frames] == [0, 2]
    for f in frames.frames:
        assert f.mask is not None and len(f.mask.candidates) == 3 and f.lens is not None
    assert frames.tracked and not frames.notes
