"""The ModernBERT decoder (the Ettin decoders) equals Hugging Face transformers (fp32, <= 1e-5) on tiny random
checkpoints written by transformers here: hidden states, every attention pattern (zero above the diagonal; the
local layers a causal sliding window of local_attention // 2 tokens), LM logits, on the eager and the fast
(SDPA) path, padded batches included, the decoder tied and untied. Its tokenizer (byte-level BPE with
ModernBERT's special tokens, trained here with `tokenizers`) equals transformers'. A left-to-right model refuses,
in words, what it cannot do, and the Mask tab guesses the next word, as it does for GPT-2. The hub name downloads
from a Hugging Face-compatible server on loopback."""

from __future__ import annotations

import json

import pytest
import torch
from fake_hub import download_then_next_word_logits
from safetensors.torch import load_file
from tiny_models import CORPUS, TOKENIZER_TEXTS, max_diff, save_wide
from tiny_models import _transformers as _hf

from bertlab.families import LAYER_HOOKS
from bertlab.loading import load, load_model, save_pretrained
from bertlab.masks import causal
from bertlab.model import MissingHeadError
from bertlab.tokenizer import Tokenizer

TOL = 1e-5
WINDOW = 6  # local_attention: a local layer's token reads the last 3 tokens (itself included)
SIZE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=96, local_attention=WINDOW, global_attn_every_n_layers=2)
ARCHS = ["ModernBertDecoderForCausalLM", "ModernBertDecoderForCausalLM-untied", "ModernBertDecoderModel"]
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank today.",
         "Café, naïve, résumé: accents are part of the language.",
         "Short one."]


def decoder_tokenizer():
    """A decoder's kind of ModernBERT tokenizer, trained on CORPUS: byte-level BPE, ModernBERT's special tokens,
    [CLS] (the beginning of a text) before it, nothing after."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as RustTokenizer

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False, special=True)])
    tok.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0", pair="[CLS]:0 $A:0 $B:1",
                                                       special_tokens=[("[CLS]", tok.token_to_id("[CLS]"))])
    return _hf().PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", bos_token="[CLS]", eos_token="[SEP]", model_input_names=["input_ids", "attention_mask"])


def write_checkpoint(folder, arch: str, tok, seed: int = 0, **changes):
    """A tiny random ModernBERT decoder of `arch` ("-untied": its own decoder weight) written by transformers,
    weights drawn wide enough that every pattern is sharp, and `tok`."""
    T = _hf()
    torch.manual_seed(seed)
    name, _, untied = arch.partition("-")
    cfg = T.ModernBertDecoderConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                                    cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                                    eos_token_id=tok.sep_token_id, tie_word_embeddings=not untied,
                                    **{**SIZE, **changes})
    model = getattr(T, name)(cfg).eval()
    return save_wide(model, tok, folder)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mbd-tok")
    decoder_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_tok(tokenizer_folder):
    return _hf().AutoTokenizer.from_pretrained(tokenizer_folder)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, hf_tok):
    root = tmp_path_factory.mktemp("modernbert-decoder")
    return {arch: write_checkpoint(root / arch, arch, hf_tok, seed=i) for i, arch in enumerate(ARCHS)}




def _batch(tok: Tokenizer):
    batch = tok.encode_batch(TEXTS)
    assert batch.input_ids.shape[1] > 4 * WINDOW and not bool(batch.attention_mask.all())  # long, and padded
    return batch.input_ids, batch.attention_mask


def compare(model, hf, ids, mask, path: str, logits: bool) -> dict[str, float]:
    """Max abs differences to transformers by what is compared (each asserted <= TOL); padded positions are
    left out of per-token outputs, never out of the patterns."""
    fam = model.family
    model.set_attn_implementation(path)
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    if path == "eager":
        names += fam.layer_hook_names("hook_pattern")
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, None, mask, names=names)
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=path == "eager")
    assert len(ref.hidden_states) == fam.num_layers + 1
    diffs = {"embeddings": max_diff(cache[fam.embedding_hook], ref.hidden_states[0], mask),
             "hidden states": max(max_diff(cache[fam.hook_name(i, "hook_resid_post")], ref.hidden_states[i + 1], mask)
                                  for i in range(fam.num_layers)),
             "last_hidden_state": max_diff(out.last_hidden_state, ref.hidden_states[-1], mask)}
    if path == "eager":
        assert len(ref.attentions) == fam.num_layers
        diffs["patterns"] = max(max_diff(cache[fam.hook_name(i, "hook_pattern")], a)
                                for i, a in enumerate(ref.attentions))
    if logits:
        diffs["lm_logits"] = max_diff(out.lm_logits, ref.logits, mask)
    assert all(v <= TOL for v in diffs.values()), (path, diffs)
    return diffs


@pytest.mark.parametrize("path", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_modernbert_decoder_equals_transformers(checkpoints, arch, path):
    model, tok = load(str(checkpoints[arch]))
    name = arch.partition("-")[0]
    assert model.family.name == "modernbert-decoder" and model.family.causal
    assert model.has_lm == (name == "ModernBertDecoderForCausalLM")
    hf = getattr(_hf(), name).from_pretrained(checkpoints[arch], attn_implementation=path).eval()
    ids, mask = _batch(tok)
    compare(model, hf, ids, mask, path, logits=model.has_lm)


def test_patterns_are_causal_and_local_layers_a_sliding_window(checkpoints):
    """Layers 0 and 2 are global, 1 and 3 local: nothing above the diagonal for any real token; a local layer
    reads only the last local_attention // 2 tokens (itself included), a global one reads further back. (A padded
    query further than the window from every real token reads nothing: its row is even, as transformers' is.)"""
    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    ids, mask = _batch(tok)
    fam = model.family
    _, cache = model.run_with_cache(ids, None, mask, names=fam.layer_hook_names("hook_pattern"))
    assert [layer.attn.kind for layer in model.model.layers] == ["global", "local", "global", "local"]
    n = ids.shape[1]
    pos = torch.arange(n)
    far = (pos[:, None] - pos[None, :]) >= WINDOW // 2  # [query, key]: keys further back than the window
    real = mask[0].bool()  # the longest text: no padding
    for i in range(fam.num_layers):
        pattern = cache[fam.hook_name(i, "hook_pattern")]  # [batch, head, query, key]
        real_rows = pattern * mask[:, None, :, None]  # a padded query of a local layer may see no real key at all
        assert float(real_rows[..., ~causal(n)].abs().max()) == 0.0, i  # zero above the diagonal
        behind = pattern[0][:, real][:, :, real][:, far[real][:, real]]
        if i % 2:
            assert float(behind.abs().max()) == 0.0, i
        else:
            assert float(behind.max()) > 1e-3, i
    short = mask[2].bool()  # padding is never read by a real token
    assert all(float(cache[fam.hook_name(i, "hook_pattern")][2][:, short][:, :, ~short].max()) == 0.0
               for i in range(fam.num_layers))


def test_hook_points_and_protocol(checkpoints):
    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    fam = model.family
    names = set(model.hook_names())
    for short in LAYER_HOOKS:
        for i in range(fam.num_layers):
            assert fam.hook_name(i, short) in names, short
    assert fam.hook_name(1, "hook_pattern") == "model.layers.1.attn.hook_pattern"
    assert not fam.has_segments and fam.positions == "rotary" and fam.tokenizer_title == "byte-level BPE"
    attn = model.model.layers[0].attn
    assert not hasattr(attn, "Wqkv") and attn.q_proj.weight.shape == (32, 32)  # q, k, v apart, as transformers
    assert fam.title == "ModernBERT decoder" and model.describe().startswith("modernbert-decoder:")


def test_bertlab_save_reads_back_in_transformers(checkpoints, tmp_path):
    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    save_pretrained(model, tok, tmp_path / "saved")
    keys = set(load_file(tmp_path / "saved" / "model.safetensors"))
    assert "decoder.weight" not in keys and "decoder.bias" in keys  # tied: stored once, as transformers does
    hf = _hf().ModernBertDecoderForCausalLM.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    ids, mask = _batch(tok)
    compare(model, hf, ids, mask, "eager", logits=True)
    again, _ = load(str(tmp_path / "saved"))
    assert again.hf_config()["architectures"] == ["ModernBertDecoderForCausalLM"]


def test_tokenizer_equals_transformers(tokenizer_folder, hf_tok):
    ours = Tokenizer.from_folder(tokenizer_folder)
    assert ours.vocab_size == len(hf_tok) and not ours.is_wordpiece
    for text in TOKENIZER_TEXTS:
        ref = hf_tok(text, return_offsets_mapping=True)
        enc = ours.encode(text)
        assert enc.ids == ref["input_ids"] and enc.tokens == ref.tokens(), text
        assert enc.offsets == [tuple(o) for o in ref["offset_mapping"]] and enc.word_ids == ref.word_ids(), text
    batch, ref = ours.encode_batch(TEXTS), hf_tok(TEXTS, padding=True, return_tensors="pt")
    assert torch.equal(batch.input_ids, ref["input_ids"]) and torch.equal(batch.attention_mask, ref["attention_mask"])


def test_a_left_to_right_model_refuses_what_it_cannot_do(checkpoints):
    model, _ = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    assert not model.has_mlm and not model.has_nsp
    with pytest.raises(MissingHeadError, match="ModernBERT decoder reads left to right: it predicts the next word, "
                                               "not a masked one"):
        model.require("mlm")
    with pytest.raises(MissingHeadError, match="reads left to right"):
        model.mlm_head(torch.zeros(1, 32))
    with pytest.raises(MissingHeadError, match="never learned whether sentence B follows sentence A"):
        model.require("nsp")
    with pytest.raises(MissingHeadError, match="no token has read the whole text"):
        model.require("sequence_classification")
    model.require("lm")
    bare, _ = load(str(checkpoints["ModernBertDecoderModel"]))
    with pytest.raises(MissingHeadError, match="no LM head"):
        bare.require("lm")
    with pytest.raises(ValueError, match="reads left to right: no token has read the whole text"):
        model.with_heads(("lm",), task="sequence_classification")
    with pytest.raises(ValueError, match="predicts the next word, not a masked one"):
        model.with_heads(("mlm",))


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}}, "rope_type"),
    ({"architectures": ["ModernBertDecoderForSequenceClassification"]}, "ModernBertDecoderForCausalLM"),
])
def test_configs_bertlab_cannot_build_are_refused_by_name(checkpoints, tmp_path, change, message):
    from bertlab.weights import CheckpointError

    src = checkpoints["ModernBertDecoderForCausalLM"]
    folder = tmp_path / "bad"
    folder.mkdir()
    for f in src.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=message):
        load_model(folder)


def test_mask_tab_guesses_the_next_word_and_says_why(checkpoints):
    """The Mask tab on the decoder: the guesses for the token after the text (its LM logits at the last token),
    the note saying why it cannot fill in a hidden word; nothing that hides words on show."""
    from bertlab.analysis.needs import lacks
    from bertlab.panels.mask import MaskPanel

    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    panel = MaskPanel(model, tok)
    assert len(panel.predictions) == 1
    pred = panel.predictions[0]
    ids = torch.tensor([tok.encode(panel.text.value).ids])
    with torch.no_grad():
        want = model(ids).lm_logits[0, -1].softmax(-1)
    assert pred.next_word and pred.position == ids.shape[1] - 1 and pred.label.startswith("the token after")
    assert abs(pred.top.probability - float(want[pred.top.token_id])) < 1e-6
    assert "reads left to right" in panel.message.value and "next word" in panel.message.value
    assert panel.word_buttons.layout.display == "none" and panel.each_button.layout.display == "none"
    assert "predicts the next word, not a masked one" in lacks(model, "mlm_head")


def test_the_next_token_lens_and_the_attention_tab(checkpoints):
    """The Ablation tab's lens reads the LM head's guess after every layer (the last the model's own); the
    Attention tab draws a lower triangle."""
    from bertlab.panels.ablation import AblationPanel
    from bertlab.panels.attention import AttentionPanel

    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    lens = AblationPanel(model, tok).lens
    ids = torch.tensor([tok.encode(AblationPanel(model, tok).text.value).ids])
    with torch.no_grad():
        want = model(ids).lm_logits[0, -1].log_softmax(-1)
    assert lens is not None and lens.next_token and lens.query.target_id == int(want.argmax())
    assert abs(float(lens.target_log_probs[-1]) - float(want.max())) < 1e-5
    panel = AttentionPanel(model, tok)
    assert "right of the diagonal is 0 (the causal mask)" in panel.message.value
    z = panel.figures()["heatmap"].data[0].z  # [query, key] of the head on show
    assert all(float(z[q][k]) == 0.0 for q in range(len(z)) for k in range(q + 1, len(z[q])))


def test_an_ettin_encoder_beside_its_decoder_in_the_family_tab(checkpoints, tmp_path):
    """The Family tab's "both ways vs left to right" on an Ettin pair (a ModernBERT encoder with its MLM head,
    and the decoder): the decoder's pattern is a lower triangle, its guess for a word ignores every later word,
    the encoder's does not."""
    from test_family_modernbert import modernbert_tokenizer
    from test_family_modernbert import write_checkpoint as write_encoder

    from bertlab.analysis.both_ways import both_ways, pattern, pick_pair
    from bertlab.analysis.family import Loaded, word_choices

    encoder = Loaded("ettin-encoder", *load(str(write_encoder(tmp_path / "enc", "ModernBertForMaskedLM",
                                                              modernbert_tokenizer()))))
    decoder = Loaded("ettin-decoder", *load(str(checkpoints["ModernBertDecoderForCausalLM"])))
    assert pick_pair([decoder, encoder]) == (encoder, decoder)
    text, later = "The quick brown fox jumps over the lazy dog.", "The quick brown fox sleeps under a warm red blanket."
    tri = pattern(decoder.model, decoder.tok, text, 1, 2)
    assert float(tri[~causal(tri.shape[0])].abs().max()) == 0.0
    a, b = (both_ways(encoder, decoder, t, next(w for w in word_choices(t) if w.text == "fox"), layer=1, head=2, k=5)
            for t in (text, later))
    assert [c.token for c in a.causal.guess.candidates] == [c.token for c in b.causal.guess.candidates]
    assert all(abs(x.probability - y.probability) < 1e-6
               for x, y in zip(a.causal.guess.candidates, b.causal.guess.candidates))
    assert max(abs(x.probability - y.probability)
               for x, y in zip(a.encoder.guess.candidates, b.encoder.guess.candidates)) > 1e-4
    assert a.causal.reads == "from the left only" and a.encoder.reads == "from both sides"


def test_download_then_load_offline(tmp_path, hf_tok):
    """`bertlab download jhu-clsp/ettin-decoder-17m` from the loopback hub (a tiny stand-in under the real name),
    then `bertlab.load(name)` offline: the same logits as the folder it was made from."""
    name = "jhu-clsp/ettin-decoder-17m"
    folder = write_checkpoint(tmp_path / "ettin", "ModernBertDecoderForCausalLM", hf_tok, seed=3)
    family, logits = download_then_next_word_logits(tmp_path, name, folder)
    model, tok = load(str(folder))
    with torch.no_grad():
        ref = model(torch.tensor([tok.encode("the quick fox").ids])).lm_logits[0, -1, :5]
    assert family == "modernbert-decoder"
    torch.testing.assert_close(torch.tensor(logits), ref, atol=1e-5, rtol=0)


def test_the_band_views_draw_the_causal_window_the_model_applies(checkpoints):
    """The Family tab's "which keys a query may read" and the Attention tab's outline on the decoder: a global
    layer reads every key to its left, a local one itself and local_attention // 2 - 1 tokens back; where any
    head puts weight is exactly there; the notes say so (no "±": nothing ahead is read)."""
    from bertlab.analysis.attention import attention_patterns
    from bertlab.analysis.family import attention_reach
    from bertlab.families.modernbert_decoder import causal_window
    from bertlab.viz.attention import heatmap_marks
    from bertlab.viz.family import plot_attention_reach

    model, tok = load(str(checkpoints["ModernBertDecoderForCausalLM"]))
    text = TEXTS[0]
    reach = attention_reach(model, tok, text)
    n = len(reach.labels)
    assert reach.causal and reach.kinds == ["global", "local", "global", "local"] and reach.window == WINDOW // 2 - 1
    assert torch.equal(reach.full, causal(n)) and torch.equal(reach.local, causal_window(n, WINDOW // 2))
    ids = torch.tensor([tok.encode(text).ids])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=model.family.layer_hook_names("hook_pattern"))
    for i, kind in enumerate(reach.kinds):
        seen = (cache[model.family.hook_name(i, "hook_pattern")][0] > 0).any(dim=0)  # [query, key]
        assert torch.equal(seen, reach.local if kind == "local" else reach.full), i
    titles = [a.text for a in plot_attention_reach("ettin-decoder", reach).layout.annotations]
    assert any("every key to the left" in t for t in titles) and any("tokens back" in t for t in titles)
    result = attention_patterns(model, tok, text)
    local, full = heatmap_marks(result, 1), heatmap_marks(result, 0)
    assert "itself and the 2 tokens before it" in local["annotations"][0]["text"]
    assert "every token before it" in full["annotations"][0]["text"]
