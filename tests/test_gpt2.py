"""GPT-2 equals Hugging Face transformers (fp32, <= 1e-5) on tiny random checkpoints written by transformers
here: hidden states, every attention pattern (lower triangular: nothing to the right), LM logits, on the eager
and the fast (SDPA) path, padded batches included. Its tokenizer (byte-level BPE with <|endoftext|> its only
special token, trained here with `tokenizers`) equals transformers' GPT2Tokenizer. A left-to-right model
refuses, in words, what it cannot do (fill in a masked word, NSP, a [CLS] classifier). The hub name downloads
from a Hugging Face-compatible server on loopback."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from fake_hub import download_then_next_word_logits
from safetensors.torch import load_file, save_file
from tiny_models import CORPUS, TOKENIZER_TEXTS, max_diff, save_wide
from tiny_models import _transformers as _hf

from bertlab.families import LAYER_HOOKS
from bertlab.loading import load, load_model, save_pretrained
from bertlab.masks import causal
from bertlab.model import MissingHeadError
from bertlab.tokenizer import Tokenizer

TOL = 1e-5
SIZE = dict(n_embd=32, n_layer=3, n_head=4, n_positions=64)
ARCHS = ["GPT2LMHeadModel", "GPT2Model"]
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "Café, naïve, résumé: accents are part of the language.",
         "Short one."]
TOKENIZER_TEXTS = [*TOKENIZER_TEXTS, "Two texts<|endoftext|>joined by the end-of-text token."]


def gpt2_tokenizer():
    """GPT-2's kind of tokenizer, trained on CORPUS: byte-level BPE, <|endoftext|> its only special token."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return _hf().GPT2Tokenizer(vocab=model["vocab"], merges=merges)


def write_checkpoint(folder, arch: str, tok, seed: int = 0, **changes):
    """A tiny random GPT-2 of `arch` written by transformers, weights drawn wide enough that every pattern
    is sharp, and `tok`."""
    T = _hf()
    torch.manual_seed(seed)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = T.GPT2Config(vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos, **{**SIZE, **changes})
    model = getattr(T, arch)(cfg).eval()
    return save_wide(model, tok, folder)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2-tok")
    gpt2_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_tok(tokenizer_folder):
    return _hf().AutoTokenizer.from_pretrained(tokenizer_folder)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, hf_tok):
    root = tmp_path_factory.mktemp("gpt2")
    return {arch: write_checkpoint(root / arch, arch, hf_tok, seed=i) for i, arch in enumerate(ARCHS)}




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
        above = ~causal(ids.shape[1])  # keys to the right of each query
        assert all(float(cache[fam.hook_name(i, "hook_pattern")][..., above].abs().max()) == 0.0
                   for i in range(fam.num_layers))
    if logits:
        diffs["lm_logits"] = max_diff(out.lm_logits, ref.logits, mask)
    assert all(v <= TOL for v in diffs.values()), (path, diffs)
    return diffs


def _batch(tok: Tokenizer):
    batch = tok.encode_batch(TEXTS)
    assert not bool(batch.attention_mask.all())  # padded
    return batch.input_ids, batch.attention_mask


@pytest.mark.parametrize("path", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gpt2_equals_transformers(checkpoints, arch, path):
    model, tok = load(str(checkpoints[arch]))
    assert model.family.name == "gpt2" and model.family.causal and model.has_lm  # the tied head: the embeddings
    hf = getattr(_hf(), arch).from_pretrained(checkpoints[arch], attn_implementation=path).eval()
    ids, mask = _batch(tok)
    compare(model, hf, ids, mask, path, logits=arch == "GPT2LMHeadModel")
    if arch == "GPT2Model":  # the same file read by GPT2LMHeadModel: the head bertlab gave it is transformers' too
        lm = _hf().GPT2LMHeadModel.from_pretrained(checkpoints[arch], attn_implementation=path).eval()
        compare(model, lm, ids, mask, path, logits=True)


def test_bertlab_save_reads_back_in_transformers(checkpoints, tmp_path):
    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    save_pretrained(model, tok, tmp_path / "saved")
    keys = set(load_file(tmp_path / "saved" / "model.safetensors"))
    assert "lm_head.weight" not in keys and "transformer.wte.weight" in keys  # tied: stored once, as HF does
    T = _hf()
    hf = T.GPT2LMHeadModel.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    ids, mask = _batch(tok)
    compare(model, hf, ids, mask, "eager", logits=True)
    again, _ = load(str(tmp_path / "saved"))
    assert again.hf_config()["architectures"] == ["GPT2LMHeadModel"]


def test_older_files_with_mask_buffers_and_bare_keys_load(checkpoints, tmp_path):
    """The hub's gpt2 file keeps the causal mask as buffers (h.N.attn.bias, h.N.attn.masked_bias) and its keys
    without `transformer.`: both are read as transformers reads them."""
    src = checkpoints["GPT2LMHeadModel"]
    folder = tmp_path / "old"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((src / name).read_bytes())
    state = {k.removeprefix("transformer."): v for k, v in load_file(src / "model.safetensors").items()}
    n = SIZE["n_positions"]
    for i in range(SIZE["n_layer"]):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(state, folder / "model.safetensors")
    old, _ = load(str(folder))
    new, tok = load(str(src))
    ids, mask = _batch(tok)
    with torch.no_grad():
        assert max_diff(old(ids, None, mask).lm_logits, new(ids, None, mask).lm_logits) == 0.0


def test_hook_points_and_protocol(checkpoints):
    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    fam = model.family
    names = set(model.hook_names())
    for short in LAYER_HOOKS:
        for i in range(fam.num_layers):
            assert fam.hook_name(i, short) in names, short
    for short in ("hook_word", "hook_position", "hook_sum", "hook_out"):
        assert fam.embedding_part_hook(short) in names
    assert fam.embedding_part_hook("hook_word") == "transformer.hook_word"
    assert not fam.has_segments and fam.positions == "learned" and fam.tokenizer_title == "byte-level BPE"
    ids, mask = _batch(tok)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, None, mask, names=[fam.embedding_hook, "transformer.hook_word"])
        emb = fam.embeddings(model)
        assert emb.word_embeddings is model.transformer.wte
        assert max_diff(emb(ids, None), cache[fam.embedding_hook]) == 0.0  # the embeddings alone, hooks firing
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()} | {"lm_head.weight"}  # no views
    with torch.no_grad():  # hook_result: each head's write sums to the attention output minus its bias
        _, c = model.run_with_cache(ids, None, mask, names=fam.layer_hook_names("hook_result")
                                    + fam.layer_hook_names("hook_attn_out"))
    bias = model.transformer.h[0].attn.c_proj.bias
    assert max_diff(c[fam.hook_name(0, "hook_result")].sum(2) + bias, c[fam.hook_name(0, "hook_attn_out")]) < 1e-5
    assert "GPT-2" == fam.title and model.describe().startswith("gpt2:") and "LM" in model.describe()


def test_next_token_lens_reads_every_stage_through_ln_f(checkpoints):
    """Pre-norm: the next-token lens at stage s (after block s - 1) equals the LM logits of the model cut to
    its first s blocks; the last stage is the model's own output."""
    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    fam = model.family
    ids = torch.tensor([tok.encode(TEXTS[0]).ids])
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=names)
        states = torch.stack([cache[n][0, -1] for n in names])  # [stage, d_model] at the last position
        lens = model.next_token_logits(model.lens_input(states))  # [stage, vocab]
        for s in range(1, fam.num_layers + 1):
            cut = copy.deepcopy(model)
            cut.transformer.h = cut.transformer.h[:s]
            assert max_diff(cut(ids).lm_logits[0, -1], lens[s]) < 1e-4, s


def test_tokenizer_equals_transformers(tokenizer_folder, hf_tok, tmp_path):
    ours = Tokenizer.from_folder(tokenizer_folder)
    eos = hf_tok.convert_tokens_to_ids("<|endoftext|>")
    assert set(ours.special_tokens.values()) == {"<|endoftext|>"} and ours.special_ids == {eos}
    assert ours.vocab_size == len(hf_tok) and not ours.is_wordpiece
    for text in TOKENIZER_TEXTS:
        ref = hf_tok(text, return_offsets_mapping=True)
        enc = ours.encode(text)
        assert enc.ids == ref["input_ids"] and enc.tokens == ref.tokens(), text
        assert enc.offsets == [tuple(o) for o in ref["offset_mapping"]] and enc.word_ids == ref.word_ids(), text
        assert ours.decode(enc.ids, skip_special_tokens=False) == hf_tok.decode(ref["input_ids"]), text
    a, b = "Where is the fox?", "It jumps over the dog."
    pair, ref = ours.encode(a, b), hf_tok(a, b)
    assert pair.ids == ref["input_ids"] and pair.sequence_ids == ref.sequence_ids()  # no separator: A then B
    assert ours.readable_pieces(ours.tokenize("café"))[-1].endswith("é")
    ours.save(tmp_path)
    back = _hf().AutoTokenizer.from_pretrained(tmp_path)
    for text in TOKENIZER_TEXTS:
        assert back(text)["input_ids"] == ours.encode(text).ids == Tokenizer.from_folder(tmp_path).encode(text).ids


def test_a_left_to_right_model_refuses_what_it_cannot_do(checkpoints):
    model, _ = load(str(checkpoints["GPT2LMHeadModel"]))
    assert not model.has_mlm and not model.has_nsp
    with pytest.raises(MissingHeadError, match="reads left to right: it predicts the next word, not a masked one"):
        model.require("mlm")
    with pytest.raises(MissingHeadError, match="reads left to right"):
        model.mlm_head(torch.zeros(1, 32))
    with pytest.raises(MissingHeadError, match="never learned whether sentence B follows sentence A"):
        model.require("nsp")
    with pytest.raises(MissingHeadError, match="no token has read the whole text"):
        model.require("sequence_classification")
    model.require("lm")
    bare = model.with_heads(())
    with pytest.raises(MissingHeadError, match="no LM head"):
        bare.require("lm")
    with pytest.raises(ValueError, match="reads left to right: no token has read the whole text"):
        model.with_heads((), task="sequence_classification")
    with pytest.raises(ValueError, match="predicts the next word, not a masked one"):
        model.with_heads(("mlm",))


@pytest.mark.parametrize("change,message", [({"add_cross_attention": True}, "cross-attention"),
                                            ({"activation_function": "swish"}, "activation_function")])
def test_configs_bertlab_cannot_build_are_refused_by_name(checkpoints, tmp_path, change, message):
    from bertlab.weights import CheckpointError

    src = checkpoints["GPT2LMHeadModel"]
    folder = tmp_path / "bad"
    folder.mkdir()
    for f in src.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=message):
        load_model(folder)


def test_download_then_load_offline(tmp_path, hf_tok):
    """`bertlab download openai-community/gpt2` from the loopback hub (a tiny stand-in under the real name),
    then `bertlab.load(name)` offline: the same logits as the folder it was made from."""
    name = "openai-community/gpt2"
    folder = write_checkpoint(tmp_path / "gpt2", "GPT2LMHeadModel", hf_tok, seed=3)
    family, logits = download_then_next_word_logits(tmp_path, name, folder)
    model, tok = load(str(folder))
    with torch.no_grad():
        ref = model(torch.tensor([tok.encode("the quick fox").ids])).lm_logits[0, -1, :5]
    assert family == "gpt2"
    torch.testing.assert_close(torch.tensor(logits), ref, atol=1e-5, rtol=0)


def test_mask_tab_guesses_the_next_word_and_says_why(checkpoints):
    """The Mask tab on a left-to-right model: the guesses for the token after the text (its LM logits at the
    last token), the note saying why it cannot fill in a hidden word; nothing that hides words on show."""
    from bertlab.analysis.needs import lacks
    from bertlab.panels.mask import MaskPanel

    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    panel = MaskPanel(model, tok)
    assert panel.text.value.endswith("a gallon of") and len(panel.predictions) == 1
    pred = panel.predictions[0]
    ids = torch.tensor([tok.encode(panel.text.value).ids])
    with torch.no_grad():
        want = model(ids).lm_logits[0, -1].softmax(-1)
    assert pred.next_word and pred.position == ids.shape[1] - 1 and pred.label.startswith("the token after")
    assert abs(pred.top.probability - float(want[pred.top.token_id])) < 1e-6
    assert "reads left to right" in panel.message.value and "next word" in panel.message.value
    assert panel.word_buttons.layout.display == "none" and panel.each_button.layout.display == "none"
    assert "guesses for the hidden words" in panel.figures()
    panel.text.value = "Hello"
    assert panel.predictions[0].tokens == tok.encode("Hello").tokens
    assert "predicts the next word, not a masked one" in lacks(model, "mlm_head")


def test_tabs_that_cannot_work_say_so_plainly(checkpoints, tmp_path):
    """Next sentence, Input and Family on a left-to-right model say what it cannot do; Fine-tuning's Start
    refuses a [CLS] classifier in words (no traceback, no HF class name)."""
    from test_labs_every_family import write_sst2

    from bertlab.analysis.family import view_model
    from bertlab.analysis.needs import lacks
    from bertlab.panels.finetune import FinetunePanel
    from bertlab.workspace import Workspace

    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    assert "reads left to right and has no sentence-pair head" in lacks(model, "pair_head")
    assert "no separator token" in lacks(model, "segment_embeddings")
    view = view_model("gpt2", model, tok, "The cat sat on the mat.", None, k=3)
    assert view.masked is None and view.pair is None
    ws = Workspace(tmp_path / "ws")
    panel = FinetunePanel(model, tok, device="cpu", workspace=ws)
    panel.path.value = str(write_sst2(ws.uploads / "sst2"))
    panel.max_train.value, panel.max_dev.value, panel.epochs.value, panel.batch.value = 16, 8, 1, 8
    panel.start_button.click()
    if panel.job is not None:
        panel.job.wait(60)
    errors = " ".join(text for level, text in panel.messages if level == "error")
    assert "GPT-2 reads left to right: no token has read the whole text" in errors, panel.messages


def test_ablation_tab_shows_the_next_token_lens(checkpoints):
    """The Ablation tab on a left-to-right model: no head switches (they ablate a masked word), the lens reads
    the LM head's guess for the token after the text at every stage, the last stage the model's own."""
    from bertlab.panels.ablation import AblationPanel

    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    panel = AblationPanel(model, tok)
    lens = panel.lens
    assert lens is not None and lens.next_token and panel.grid.layout.display == "none"
    assert "reads left to right" in panel.message.value and "next-token lens" in panel.message.value
    ids = torch.tensor([tok.encode(panel.text.value).ids])
    with torch.no_grad():
        want = model(ids).lm_logits[0, -1].log_softmax(-1)
    assert lens.query.position == ids.shape[1] - 1 and lens.query.target_id == int(want.argmax())
    assert abs(float(lens.target_log_probs[-1]) - float(want.max())) < 1e-5
    assert "Next-token lens" in panel.figures()["logit lens"].layout.title.text


def test_pretraining_tab_refuses_a_tokenizer_without_a_mask_token(checkpoints):
    """GPT-2's tokenizer has one special token for every role: hiding words with it would hide padding too."""
    from bertlab.panels.pretrain import PretrainPanel

    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    panel = PretrainPanel(model, tok)
    panel.start.click()
    assert panel.job.state == "pending" and "has no mask token of its own" in panel.run_messages[-1][1]


def test_the_model_card_names_the_next_word_head(checkpoints):
    from bertlab.viz.picker import model_card

    model, _ = load(str(checkpoints["GPT2LMHeadModel"]))
    card = model_card(model, "gpt2")
    assert "✓ next-word head (reads left to right)" in card and "✗ MLM head" in card


def test_attention_tab_draws_the_triangle_and_says_it_is_the_mask(checkpoints):
    from bertlab.panels.attention import AttentionPanel

    model, tok = load(str(checkpoints["GPT2LMHeadModel"]))
    panel = AttentionPanel(model, tok)
    assert "right of the diagonal is 0 (the causal mask)" in panel.message.value
    z = panel.figures()["heatmap"].data[0].z  # [query, key] of the head on show
    assert all(float(z[q][k]) == 0.0 for q in range(len(z)) for k in range(q + 1, len(z[q])))


def test_a_hub_style_folder_naming_no_tokenizer_class_reads_as_gpt2s(checkpoints, hf_tok, tmp_path):
    """The hub's gpt2 folder: tokenizer_config.json says only model_max_length, tokenizer.json's post-processor
    is ByteLevel; config.json's model_type picks GPT-2's pipeline and its one special token."""
    src = checkpoints["GPT2LMHeadModel"]
    folder = tmp_path / "hub-style"
    folder.mkdir()
    (folder / "config.json").write_bytes((src / "config.json").read_bytes())
    tok_json = json.loads((src / "tokenizer.json").read_text())
    tok_json["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                                  "use_regex": True}
    (folder / "tokenizer.json").write_text(json.dumps(tok_json))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    ours = Tokenizer.from_folder(folder)
    assert set(ours.special_tokens.values()) == {"<|endoftext|>"} and ours.model_max_length == 1024
    for text in TOKENIZER_TEXTS:
        ref = hf_tok(text, return_offsets_mapping=True)
        enc = ours.encode(text)
        assert enc.ids == ref["input_ids"] and enc.offsets == [tuple(o) for o in ref["offset_mapping"]], text


def test_a_bert_decoder_gets_the_same_next_word_views(tmp_path):
    """A BertLMHeadModel (is_decoder) reads left to right too: the protocol calls it causal, its next-word head
    is its MLM head, and the Mask and Ablation tabs ask it for the word after the text, as they ask GPT-2."""
    from tiny_models import _transformers, wordpiece

    from bertlab.panels.ablation import AblationPanel
    from bertlab.panels.mask import MaskPanel

    T, hf = _transformers(), wordpiece()
    cfg = T.BertConfig(vocab_size=len(hf), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=80, is_decoder=True)
    torch.manual_seed(0)
    T.BertLMHeadModel(cfg).eval().save_pretrained(tmp_path / "dec")
    hf.save_pretrained(tmp_path / "dec")
    model, tok = load(str(tmp_path / "dec"))
    assert model.family.causal and model.has_lm and not model.family.family.causal
    ids = torch.tensor([tok.encode("the cat sat on the").ids])
    with torch.no_grad():
        out = model(ids)
        want = out.mlm_logits[0, -1].softmax(-1)
        assert max_diff(model.next_token_logits(out.last_hidden_state[0, -1]), out.mlm_logits[0, -1]) < 1e-6
    panel = MaskPanel(model, tok, text="the cat sat on the")
    assert panel.predictions[0].next_word and "reads left to right" in panel.message.value
    assert abs(panel.predictions[0].top.probability - float(want.max())) < 1e-6
    assert AblationPanel(model, tok, text="the cat sat on the", target="").lens.next_token
