"""Every family member equals Hugging Face transformers (fp32, <= 1e-5): hidden states, every
attention pattern, every head's logits, both attention paths; bertlab's save reads back in
transformers; broken checkpoints and configs are refused with a message naming the file."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertlab.families import FAMILIES, model_family
from bertlab.loading import load, load_model, save_pretrained
from bertlab.weights import CheckpointError

TOL = 1e-5
BERT_LIKE = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=70)
CONFIGS = {  # model_type -> (HF config class, kwargs)
    "bert": ("BertConfig", BERT_LIKE),
    "roberta": ("RobertaConfig", {**BERT_LIKE, "type_vocab_size": 1}),
    "albert": ("AlbertConfig", {**BERT_LIKE, "embedding_size": 16, "num_hidden_layers": 4, "num_hidden_groups": 2}),
    "distilbert": ("DistilBertConfig", dict(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                            max_position_embeddings=70)),
    "electra": ("ElectraConfig", {**BERT_LIKE, "embedding_size": 16}),
}
HEADS = {
    "bert": ["Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
             "ForQuestionAnswering"],
    "roberta": ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"],
    "albert": ["Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForQuestionAnswering"],
    "distilbert": ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                   "ForQuestionAnswering"],
    "electra": ["Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                "ForQuestionAnswering"],
}
PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert", "electra": "Electra"}
CASES = [(mt, PREFIX[mt] + h) for mt, hs in HEADS.items() for h in hs]


def _hf():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    """Random tiny checkpoints written by transformers' save_pretrained, by architecture."""
    T = _hf()
    root = tmp_path_factory.mktemp("families")
    out = {}
    for i, (mt, arch) in enumerate(CASES):
        torch.manual_seed(i)
        cls_name, kwargs = CONFIGS[mt]
        cfg = getattr(T, cls_name)(**kwargs, num_labels=2 if arch.endswith(("Answering", "PreTraining")) else 3)
        model = getattr(T, arch)(cfg).eval()
        model.save_pretrained(root / arch)
        out[arch] = root / arch
    return out


def _batch(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (3, 17), generator=g)
    types = torch.zeros_like(ids)
    if model.family.has_segments:
        types[:, 9:] = 1
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    return ids, types, mask


def _diff(a, b, mask=None) -> float:
    d = (a - b).detach().abs()
    if mask is not None:
        d = d[mask.bool()]
    return float(d.max())


def _hf_call(hf, mt, ids, types, mask, **kw):
    args = dict(input_ids=ids, attention_mask=mask, **kw)
    if mt != "distilbert":
        args["token_type_ids"] = types
    return hf(**args)


# (bertlab field, transformers field, per token?) for each head class
FIELDS = {
    "Model": [("last_hidden_state", "last_hidden_state", True), ("pooler_output", "pooler_output", False)],
    "ForMaskedLM": [("mlm_logits", "logits", True)],
    "ForSequenceClassification": [("logits", "logits", False)],
    "ForTokenClassification": [("logits", "logits", True)],
    "ForQuestionAnswering": [("start_logits", "start_logits", True), ("end_logits", "end_logits", True)],
}
PRETRAINING = {
    "bert": [("mlm_logits", "prediction_logits", True), ("nsp_logits", "seq_relationship_logits", False)],
    "albert": [("mlm_logits", "prediction_logits", True), ("nsp_logits", "sop_logits", False)],
    "electra": [("rtd_logits", "logits", True)],
}


def _fields(mt, arch):
    head = arch.removeprefix(PREFIX[mt])
    return PRETRAINING[mt] if head == "ForPreTraining" else FIELDS[head]


def _compare(model, hf, mt, arch, path, seed=0):
    ids, types, mask = _batch(model, seed)
    fam = model.family
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, types, mask, names=names)
        ref = _hf_call(hf, mt, ids, types, mask, output_hidden_states=True, output_attentions=path == "eager")
        if path == "eager":  # the pattern hooks switch the model to eager attention; read every layer's
            _, pat = model.run_with_cache(ids, types, mask, names=fam.layer_hook_names("hook_pattern"))
            assert len(ref.attentions) == fam.num_layers
            for i, a in enumerate(ref.attentions):
                assert _diff(pat[fam.hook_name(i, "hook_pattern")], a) <= TOL, (arch, i)
    hidden = ref.hidden_states
    assert len(hidden) == fam.num_layers + 1
    assert _diff(cache[fam.embedding_hook], hidden[0], mask) <= TOL
    for i in range(fam.num_layers):
        assert _diff(cache[fam.hook_name(i, "hook_resid_post")], hidden[i + 1], mask) <= TOL, (arch, i)
    checked = 0
    for ours, theirs, per_token in _fields(mt, arch):
        want = getattr(ref, theirs, None)
        if want is None:  # e.g. RobertaModel-style encoders without pooler
            assert getattr(out, ours) is None
            continue
        assert _diff(getattr(out, ours), want, mask if per_token else None) <= TOL, (arch, ours)
        checked += 1
    assert checked
    return out


@pytest.mark.parametrize("path", ["eager", "sdpa"])
@pytest.mark.parametrize("mt,arch", CASES)
def test_family_member_equals_transformers(family_checkpoints, mt, arch, path):
    model, report = load_model(family_checkpoints[arch])
    assert model.config.model_type == mt and model.family.name == mt
    model.set_attn_implementation(path)
    hf = getattr(_hf(), arch).from_pretrained(family_checkpoints[arch], attn_implementation=path).eval()
    _compare(model, hf, mt, arch, path)


@pytest.mark.parametrize("mt,arch", [c for c in CASES if c[0] != "bert"])
def test_bertlab_save_reads_back_in_transformers(family_checkpoints, tmp_path, mt, arch):
    model, _ = load_model(family_checkpoints[arch])
    save_pretrained(model, None, tmp_path / "saved")
    T = _hf()
    hf = getattr(T, arch).from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    original = getattr(T, arch).from_pretrained(family_checkpoints[arch]).eval()
    ours, theirs = hf.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k
    _compare(model, hf, mt, arch, "eager", seed=3)
    again, _ = load_model(tmp_path / "saved")  # and bertlab reads its own save
    assert again.config.pretraining_heads == model.config.pretraining_heads


def test_albert_shared_layer_has_one_cache_entry_per_depth(family_checkpoints):
    model, _ = load_model(family_checkpoints["AlbertForPreTraining"])
    fam = model.family
    assert fam.num_layers == 4
    n_params = sum(p.numel() for p in model.parameters())
    assert len([k for k in model.state_dict() if ".albert_layers.0.ffn.weight" in k]) == 2  # two groups, 4 depths
    ids, types, mask = _batch(model)
    _, cache = model.run_with_cache(ids, types, mask, names=lambda n: n.endswith(("hook_pattern", "hook_resid_post")))
    names = fam.layer_hook_names("hook_resid_post")
    assert names == [f"albert.encoder.layer.{i}.hook_resid_post" for i in range(4)]
    assert all(n in cache for n in names)
    assert cache.stack("hook_pattern").shape[0] == 4
    assert not torch.equal(cache[names[0]], cache[names[1]])  # same weights, different depths
    assert sum(p.numel() for p in model.parameters()) == n_params
    out = model(ids, types, mask)
    assert out.nsp_logits.shape == (3, 2) and out.mlm_logits.shape[-1] == model.config.vocab_size


def test_protocol_hook_names_exist_in_every_family(family_checkpoints):
    from bertlab.families import LAYER_HOOKS

    for mt, arch in [("bert", "BertModel"), ("roberta", "RobertaModel"), ("albert", "AlbertModel"),
                     ("distilbert", "DistilBertModel"), ("electra", "ElectraModel")]:
        model, _ = load_model(family_checkpoints[arch])
        fam = model.family
        for i in range(fam.num_layers):
            for short in LAYER_HOOKS:
                assert fam.hook_name(i, short) in model.hook_points, (mt, i, short)
        ids, types, mask = _batch(model)
        _, cache = model.run_with_cache(ids, types, mask, names=fam.layer_hook_names("hook_result"))
        assert cache[fam.hook_name(0, "hook_result")].shape == (3, 17, 4, 32)
        with pytest.raises(IndexError, match="layer 9 does not exist"):
            fam.hook_name(9, "hook_pattern")
    assert {"bert", "roberta", "albert", "distilbert", "electra", "modernbert", "deberta-v2"} <= set(FAMILIES)


def test_word_boundaries_come_from_word_ids():
    from bertlab.families import ModelFamily

    word_ids = [None, 0, 0, 1, 2, 2, 2, None]
    assert ModelFamily.word_spans(word_ids) == [(1, 3), (3, 4), (4, 7)]
    assert ModelFamily.word_starts(word_ids) == [False, True, False, True, True, False, False, False]
    pair = ModelFamily.word_spans([None, 0, 0, None, 0, 1, None], [None, 0, 0, None, 1, 1, None])
    assert pair == [(1, 3), (4, 5), (5, 6)]


def test_distilbert_has_no_segments_and_electra_has_rtd(family_checkpoints):
    model, _ = load_model(family_checkpoints["DistilBertModel"])
    assert model.distilbert.embeddings.token_type_embeddings is None and not model.family.has_segments
    ids, types, mask = _batch(model)
    a = model(ids, torch.ones_like(ids), mask).last_hidden_state  # segment ids mean nothing here
    assert torch.equal(a, model(ids, None, mask).last_hidden_state)
    disc, _ = load_model(family_checkpoints["ElectraForPreTraining"])
    assert disc.has_rtd and not disc.has_mlm and disc(ids, types, mask).rtd_logits.shape == (3, 17)
    gen, _ = load_model(family_checkpoints["ElectraForMaskedLM"])
    assert gen.has_mlm and not gen.has_rtd
    with pytest.raises(Exception, match="no RTD head"):
        gen.require("rtd")


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------
def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_unknown_model_type_and_architecture_are_named(family_checkpoints, tmp_path):
    folder = _copy(family_checkpoints["RobertaModel"], tmp_path / "x")
    _edit_config(folder, model_type="xlnet")
    with pytest.raises(CheckpointError, match=r"config.json: model_type 'xlnet' is not supported yet"):
        load_model(folder)
    for mt, arch in [("roberta", "RobertaForMultipleChoice"), ("bert", "BertForMultipleChoice")]:
        folder = _copy(family_checkpoints[f"{PREFIX[mt]}ForSequenceClassification"], tmp_path / arch)
        _edit_config(folder, architectures=[arch])
        with pytest.raises(CheckpointError, match=rf"config.json: architectures names '{arch}', which bertlab does"):
            load_model(folder)


@pytest.mark.parametrize("arch", ["BertModel", "AlbertForMaskedLM"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_integer_and_bool_weights_are_refused(family_checkpoints, tmp_path, arch, dtype):
    folder = _copy(family_checkpoints[arch], tmp_path / "w")
    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in state if k.endswith("word_embeddings.weight"))
    state[key] = state[key].to(dtype)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.safetensors holds non-floating-point weights: .*word_embeddings"):
        load_model(folder)


@pytest.mark.parametrize("arch", ["BertModel", "DistilBertModel", "ElectraModel"])
@pytest.mark.parametrize("change,message", [
    ({"num_hidden_layers": 20_000, "n_layers": 20_000}, "num_hidden_layers is 20000, more than bertlab runs"),
    ({"num_attention_heads": 0, "n_heads": 0}, "num_attention_heads must be at least 1"),
    ({"vocab_size": 120.5}, "vocab_size must be a whole number"),
])
def test_bad_sizes_are_refused_before_building(family_checkpoints, tmp_path, arch, change, message):
    folder = _copy(family_checkpoints[arch], tmp_path / "c")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update({k: v for k, v in change.items() if k in cfg})
    (folder / "config.json").write_text(json.dumps(cfg))
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        load_model(folder)
    assert time.perf_counter() - start < 5
    assert str(folder / "config.json") in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("arch", ["BertForSequenceClassification", "ElectraForSequenceClassification"])
def test_bad_id2label_and_random_bytes(family_checkpoints, tmp_path, arch):
    folder = _copy(family_checkpoints[arch], tmp_path / "l")
    _edit_config(folder, id2label={"zero": "neg", "1": "pos", "2": "mid"})
    with pytest.raises(CheckpointError, match=r"config.json: id2label key 'zero' is not a label number"):
        load_model(folder)
    (folder / "config.json").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CheckpointError) as e:
        load_model(folder)
    msg = str(e.value)
    assert str(folder / "config.json") in msg and len(msg) < 300 and "\\x" not in msg


def test_sharded_index_outside_the_folder_is_refused(family_checkpoints, tmp_path):
    folder = _copy(family_checkpoints["RobertaModel"], tmp_path / "inner")
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(folder / "model.safetensors", outside)
    keys = list(load_file(str(outside)))
    index = {"metadata": {}, "weight_map": {k: "../elsewhere.safetensors" for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"names a shard outside its folder"):
        load_model(folder)


@pytest.mark.parametrize("arch", ["AlbertModel", "AlbertForMaskedLM", "AlbertForPreTraining"])
def test_albert_with_several_layers_per_group_equals_transformers(tmp_path, arch):
    """inner_group_num 2 and 2 groups over 3 group calls (HF picks group int(i / 1.5)): 6 logical layers,
    each with its own hook points; hidden states, patterns and logits equal to transformers, both ways."""
    T = _hf()
    torch.manual_seed(7)
    cfg = T.AlbertConfig(**{**CONFIGS["albert"][1], "num_hidden_layers": 3}, inner_group_num=2, num_labels=2)
    T_model = getattr(T, arch)(cfg).eval()
    T_model.save_pretrained(tmp_path / "a")
    model, _ = load_model(tmp_path / "a")
    assert model.family.num_layers == 6 and model.config.num_hidden_layers == 6
    for path in ("eager", "sdpa"):
        model.set_attn_implementation(path)
        hf = getattr(T, arch).from_pretrained(tmp_path / "a", attn_implementation=path).eval()
        _compare(model, hf, "albert", arch, path)
    save_pretrained(model, None, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["num_hidden_layers"] == 3
    back = getattr(T, arch).from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    model.set_attn_implementation("eager")
    _compare(model, back, "albert", arch, "eager", seed=2)


def test_albert_inner_group_num_must_be_a_whole_number(family_checkpoints, tmp_path):
    folder = _copy(family_checkpoints["AlbertModel"], tmp_path / "g")
    _edit_config(folder, inner_group_num="two")
    with pytest.raises(CheckpointError, match=r"config.json: inner_group_num must be a whole number.*'two'"):
        load_model(folder)


UNTIED = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM", "albert": "AlbertForMaskedLM",
          "distilbert": "DistilBertForMaskedLM", "electra": "ElectraForMaskedLM"}


@pytest.mark.parametrize("mt", list(UNTIED))
def test_untied_mlm_decoder_loads_and_equals_transformers(tmp_path, mt):
    """tie_word_embeddings false: the decoder's own weight (and bias) give the logits, as in transformers;
    bertlab's save keeps it untied."""
    T = _hf()
    arch = UNTIED[mt]
    cls_name, kwargs = CONFIGS[mt]
    torch.manual_seed(11)
    hf = getattr(T, arch)(getattr(T, cls_name)(**kwargs, tie_word_embeddings=False)).eval()
    decoder = hf.get_output_embeddings()
    with torch.no_grad():  # a decoder unlike the embeddings, and a bias of its own
        decoder.weight.normal_(0, 0.5)
        if decoder.bias is not None:
            decoder.bias.normal_(0, 0.5)
    words = hf.get_input_embeddings().weight
    assert decoder.weight.data_ptr() != words.data_ptr()
    hf.save_pretrained(tmp_path / "untied")
    model, _ = load_model(tmp_path / "untied")
    ref = getattr(T, arch).from_pretrained(tmp_path / "untied", attn_implementation="eager").eval()
    _compare(model, ref, mt, arch, "eager")
    save_pretrained(model, None, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["tie_word_embeddings"] is False
    back = getattr(T, arch).from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    assert torch.equal(back.get_output_embeddings().weight, ref.get_output_embeddings().weight)
    _compare(model, back, mt, arch, "eager", seed=1)
    # the same file read as tied (the default) gives other logits: the decoder is really read
    _edit_config(tmp_path / "untied", tie_word_embeddings=True)
    tied, _ = load_model(tmp_path / "untied")
    ids, types, mask = _batch(model)
    with torch.no_grad():
        assert _diff(tied(ids, types, mask).mlm_logits, model(ids, types, mask).mlm_logits) > 1e-2


@pytest.mark.parametrize("arch", ["RobertaForMaskedLM", "AlbertForPreTraining", "DistilBertForMaskedLM",
                                  "ElectraForPreTraining"])
def test_adapters_work_on_every_family(family_checkpoints, tmp_path, arch):
    """The fine-tuning lab's Houlsby adapters: after attention and after the MLP of every logical layer,
    near-identity at the start, the only encoder weights adapter mode trains, saved and read back."""
    from bertlab.tasks import get_task
    from bertlab.training.finetune import set_trainable, with_task_head

    base, _ = load_model(family_checkpoints[arch])
    model = with_task_head(base, get_task("sst2"), adapter_size=8)
    fam = model.family
    adapters = [n for n, m in model.named_modules() if n.endswith(".adapter")]
    layers = model.config.num_hidden_groups if fam.name == "albert" else fam.num_layers  # layers with weights
    assert len(adapters) == 2 * layers  # after attention and after the MLP
    ids, types, mask = _batch(model)
    with torch.no_grad():  # the adapters start near the identity: the encoder's output barely moves
        before = base(ids, types, mask).last_hidden_state
        after = model.eval()(ids, types, mask).last_hidden_state
    assert 0 < _diff(after, before, mask) < 1e-2
    set_trainable(model, "adapter")
    model.train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(ids, types, mask).logits.sum().backward()
    opt.step()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, start[k])]
    assert any(".adapter." in k for k in changed)
    encoder = [k for k in changed if k.startswith(fam.prefix + ".") and not k.startswith(fam.pooler_prefix or "-")]
    assert encoder and all(".adapter." in k or "norm" in k.lower() for k in encoder), encoder
    model.eval()
    save_pretrained(model, None, tmp_path / "adapted")
    again, _ = load_model(tmp_path / "adapted")
    assert again.config.adapter_size == 8
    with torch.no_grad():
        assert torch.equal(again(ids, types, mask).logits, model(ids, types, mask).logits)
    plain = again.with_heads(task=again.config.task, id2label=again.config.id2label, adapter_size=None)
    assert not any(".adapter." in k for k in plain.state_dict())


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, tiny_vocab):
    T = _hf()
    torch.manual_seed(0)
    T.BertModel(T.BertConfig(**{**BERT_LIKE, "vocab_size": 500})).save_pretrained(tmp_path / "m")
    T.BertTokenizerFast.from_pretrained(tiny_vocab.parent).save_pretrained(tmp_path / "m")  # 1000 pieces
    with pytest.raises(CheckpointError, match=r"the tokenizer has 1000 pieces but the model's vocabulary holds 500"):
        load(tmp_path / "m")


def test_family_protocol_on_bert_model(tiny_checkpoints):
    model, tok = load(tiny_checkpoints["BertForPreTraining"])
    fam = model_family(model)
    assert fam.name == "bert" and fam.hook_name(1, "hook_pattern") == "bert.encoder.layer.1.attention.self.hook_pattern"
    assert fam.special_tokens(tok)["mask"] == ("[MASK]", tok.mask_token_id)


def test_with_heads_keeps_the_encoder_and_saves_for_transformers(family_checkpoints, tmp_path):
    from bertlab.families import FamilyError

    for arch, target in [("RobertaForMaskedLM", "RobertaForSequenceClassification"),
                         ("AlbertForMaskedLM", "AlbertForSequenceClassification"),
                         ("ElectraForPreTraining", "ElectraForTokenClassification")]:
        model, _ = load_model(family_checkpoints[arch])
        task = "token_classification" if "Token" in target else "sequence_classification"
        new = model.with_heads(task=task, id2label={0: "neg", 1: "pos"}).eval()
        ids, types, mask = _batch(model)
        with torch.no_grad():
            base, fresh = model(ids, types, mask), new(ids, types, mask)
        assert torch.equal(base.last_hidden_state, fresh.last_hidden_state)
        assert fresh.logits.shape[-1] == 2 and fresh.mlm_logits is None
        save_pretrained(new, None, tmp_path / target)
        hf = getattr(_hf(), target).from_pretrained(tmp_path / target).eval()
        with torch.no_grad():
            ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        assert _diff(fresh.logits, ref) <= TOL
        assert hf.config.id2label == {0: "neg", 1: "pos"}
    with pytest.raises(FamilyError, match="no electra architecture has heads"):
        model.with_heads(pretraining_heads=("rtd", "mlm"))


@pytest.mark.parametrize("arch", ["BertForPreTraining", "RobertaForMaskedLM", "AlbertForPreTraining",
                                  "DistilBertForMaskedLM", "ElectraForMaskedLM"])
def test_layer_norms_are_found_by_the_protocol_in_every_family(family_checkpoints, arch):
    """Adapter mode trains the LayerNorms too: the protocol finds them under every family's names."""
    model, _ = load_model(family_checkpoints[arch])
    norms = {f"{m}.{p}" for m, mod in model.named_modules() if isinstance(mod, torch.nn.LayerNorm)
             for p in ("weight", "bias")}
    found = {n for n, _ in model.named_parameters() if model.family.is_layer_norm(n)}
    assert found == norms and len(norms) >= 2 * (model.family.num_layers if "Albert" not in arch else 2)


@pytest.mark.parametrize("arch", ["BertModel", "RobertaModel", "AlbertModel", "DistilBertModel", "ElectraModel"])
def test_quantized_models_keep_their_hooks(family_checkpoints, arch):
    """The compression lab quantizes the Linear layers; every hook (each head's write included) still reads."""
    model, _ = load_model(family_checkpoints[arch])
    q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    fam = q.family
    ids, types, mask = _batch(model)
    _, cache = q.run_with_cache(ids, types, mask, names=[fam.hook_name(0, "hook_result"),
                                                         fam.hook_name(0, "hook_attn_out")])
    result = cache[fam.hook_name(0, "hook_result")]  # [batch, seq, head, d_model]
    assert result.shape == (3, 17, 4, 32)
    assert torch.isfinite(result).all()
    # the heads' writes add up to the projection's output, less its bias (up to int8 rounding)
    attn_out = cache[fam.hook_name(0, "hook_attn_out")]
    assert float((result.sum(2) - attn_out).std(dim=(0, 1)).max()) < 0.05


def test_bert_with_a_factorised_embedding_is_refused(family_checkpoints, tmp_path):
    folder = _copy(family_checkpoints["BertModel"], tmp_path / "e")
    _edit_config(folder, embedding_size=16)
    with pytest.raises(CheckpointError, match="embedding_size 16 differs from hidden_size 32: BERT has no embedding"):
        load_model(folder)


def test_unknown_hook_name_shows_this_models_names(family_checkpoints):
    model, _ = load_model(family_checkpoints["DistilBertModel"])
    with pytest.raises(KeyError, match="names look like 'distilbert.transformer.layer.0.attention.hook_pattern'"):
        model.run_with_cache(torch.tensor([[5, 6]]), names=["bert.encoder.layer.0.attention.self.hook_pattern"])
