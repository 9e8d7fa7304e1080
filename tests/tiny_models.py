"""Tiny models shared by the fine-tuning tests (an import, not a fixture: helpers call it too)."""

from __future__ import annotations

import copy

import torch

from bertlab.compressed.structure import prune_heads
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.tokenizer import Tokenizer


def tiny_bert(tok: Tokenizer, seed: int = 0, layers: int = 2) -> Bert:
    """An encoder-only BERT of `layers` layers (default 2), 32 wide, no dropout, with the tokenizer's vocabulary."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return Bert(cfg)


# ---------------------------------------------------------------------------------------------
# Tiny family members written by transformers, with tokenizers trained here by `tokenizers`
# (no real family tokenizer or checkpoint installs offline).
# ---------------------------------------------------------------------------------------------
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, résumé: accents are part of the language.",
    "東京は日本の首都です。我爱自然语言处理。",
    "Emoji say a lot 😀🎉👍🏽 and so do flags 🇫🇷.",
    "See https://example.org/path?q=bert&lang=en for details.",
    "Students train small models on a laptop; BERT reads both directions.",
    "ALBERT shares one layer across depth, RoBERTa drops next-sentence prediction.",
    "Numbers like 3.14159, 2026-11-24 and 1,000,000 appear too.",
] * 20
# texts a trained tokenizer is checked on against Hugging Face's: accents, other scripts, emoji, runs of spaces
TOKENIZER_TEXTS = [
    "Hello world!",
    "Crème brûlée à la française — déjà vu.",
    "自然语言处理很有趣 and mixed with English.",
    "I ❤️ transformers 🤖🚀 (really).",
    "  spaces   everywhere\tand\ttabs  ",
]
FAMILY_ARCH = {  # model_type -> the pre-training architecture a panel test drives
    "roberta": "RobertaForMaskedLM", "albert": "AlbertForPreTraining", "distilbert": "DistilBertForMaskedLM",
    "electra": "ElectraForPreTraining", "electra-generator": "ElectraForMaskedLM", "bert": "BertForPreTraining",
}


def _transformers():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def byte_level_bpe(add_prefix_space: bool = False):
    """(RoBERTa-style fast tokenizer trained on CORPUS, its special tokens by role)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    sep, cls = ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.RobertaProcessing(sep, cls, trim_offsets=True, add_prefix_space=False)
    hf = _transformers().RobertaTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", add_prefix_space=add_prefix_space)
    return hf, {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"}


def unigram():
    """(ALBERT-style Unigram fast tokenizer trained on CORPUS, its special tokens by role)."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as RustTokenizer

    tok = RustTokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.Replace("''", '"'),
                                           normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    hf = _transformers().AlbertTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>", unk_token="<unk>",
        mask_token="[MASK]", do_lower_case=True, keep_accents=False)
    return hf, {"cls": "[CLS]", "sep": "[SEP]", "pad": "<pad>", "unk": "<unk>", "mask": "[MASK]"}


def wordpiece():
    """A BERT-style WordPiece fast tokenizer trained on CORPUS (for DistilBERT and ELECTRA)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(CORPUS, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return _transformers().BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", do_lower_case=True)


def family_folder(root, member: str, seed: int = 0, tok=None):
    """A folder holding a tiny random `member` (a FAMILY_ARCH key) written by transformers'
    save_pretrained, with a tokenizer of its family's kind (or `tok`, e.g. to share one between a
    teacher and its student); its path."""
    from pathlib import Path

    T = _transformers()
    if tok is not None:
        pass
    elif member == "roberta":
        tok, _ = byte_level_bpe()
    elif member == "albert":
        tok, _ = unigram()
    else:
        tok = wordpiece()
    n = len(tok)
    small = dict(vocab_size=n, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    configs = {
        "bert": lambda: T.BertConfig(**small),
        "roberta": lambda: T.RobertaConfig(**{**small, "max_position_embeddings": 82}, type_vocab_size=1,
                                           pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                                           eos_token_id=tok.sep_token_id),
        "albert": lambda: T.AlbertConfig(**small, embedding_size=16, pad_token_id=tok.pad_token_id),
        "distilbert": lambda: T.DistilBertConfig(vocab_size=n, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                 max_position_embeddings=80, dropout=0.0, attention_dropout=0.0),
        "electra": lambda: T.ElectraConfig(**small, embedding_size=16),
        "electra-generator": lambda: T.ElectraConfig(**small, embedding_size=16),
    }
    torch.manual_seed(seed)
    model = getattr(T, FAMILY_ARCH[member])(configs[member]()).eval()
    folder = Path(root) / member
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def electra_pair_folders(root, seed: int = 0):
    """(generator folder, discriminator folder): a tiny ElectraForMaskedLM and ElectraForPreTraining
    sharing one WordPiece tokenizer (a pair is trained on one vocabulary), written by transformers."""
    from pathlib import Path

    T = _transformers()
    tok = wordpiece()
    out = []
    for i, (arch, hidden) in enumerate((("ElectraForMaskedLM", 16), ("ElectraForPreTraining", 32))):
        cfg = T.ElectraConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=2 * hidden, max_position_embeddings=80, embedding_size=16,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        torch.manual_seed(seed + i)
        folder = Path(root) / ("electra-generator" if i == 0 else "electra-discriminator")
        getattr(T, arch)(cfg).eval().save_pretrained(folder)
        tok.save_pretrained(folder)
        out.append(folder)
    return tuple(out)


def sentencepiece_folder(folder):
    """A folder as the hub's DeBERTa-v3 repositories hold the tokenizer: spm.model (trained here with
    sentencepiece), a tokenizer_config.json that names no class, config.json's model_type; its path."""
    import io
    import json

    import pytest

    spm = pytest.importorskip("sentencepiece")
    folder.mkdir(parents=True, exist_ok=True)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=130,
                                   model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]",
                                   bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]", character_coverage=1.0,
                                   minloglevel=2)
    (folder / "spm.model").write_bytes(out.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))
    if not (folder / "config.json").exists():
        (folder / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    return folder



def deberta_detector(width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of DeBERTa-v3's replaced-token detector (`mask_predictions.*`), as its hub files carry."""
    g = torch.Generator().manual_seed(seed + 1)
    return {"mask_predictions.dense.weight": 0.2 * torch.randn(width, width, generator=g),
            "mask_predictions.dense.bias": 0.1 * torch.randn(width, generator=g),
            "mask_predictions.LayerNorm.weight": 1 + 0.1 * torch.randn(width, generator=g),
            "mask_predictions.LayerNorm.bias": 0.1 * torch.randn(width, generator=g),
            "mask_predictions.classifier.weight": 0.2 * torch.randn(1, width, generator=g),
            "mask_predictions.classifier.bias": 0.1 * torch.randn(1, generator=g)}


def deberta_detector_logits(hidden: torch.Tensor, state: dict[str, torch.Tensor], eps: float = 1e-7) -> torch.Tensor:
    """The detector's logits [batch, seq] from last hidden states [batch, seq, d], written out as DeBERTa's own
    code computes them (LayerNorm of each state plus the first token's, dense, gelu, classifier)."""
    import torch.nn.functional as F

    w = {k.removeprefix("mask_predictions."): v for k, v in state.items() if k.startswith("mask_predictions.")}
    h = F.layer_norm(hidden[:, :1] + hidden, hidden.shape[-1:], w["LayerNorm.weight"], w["LayerNorm.bias"], eps)
    h = F.gelu(F.linear(h, w["dense.weight"], w["dense.bias"]))
    return F.linear(h, w["classifier.weight"], w["classifier.bias"]).squeeze(-1)


def deberta_hub_folder(folder, seed: int = 0):
    """A tiny DeBERTa-v3 laid out as the hub's microsoft/deberta-v3-* repositories are: config.json without
    architectures, pytorch_model.bin holding the encoder, DeBERTa's own MLM head (`lm_predictions`), the
    replaced-token detector (`mask_predictions`) and unused absolute position embeddings, spm.model and a
    tokenizer_config.json that names no class; its path."""
    import json
    from pathlib import Path

    T = _transformers()
    folder = Path(folder)
    torch.manual_seed(seed)
    cfg = T.DebertaV2Config(vocab_size=140, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                            position_buckets=8, max_relative_positions=-1, norm_rel_ebd="layer_norm",
                            share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False,
                            type_vocab_size=0, legacy=False)
    model = T.DebertaV2ForMaskedLM(cfg).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.update(deberta_detector(32, seed))
    g = torch.Generator().manual_seed(seed)
    state["deberta.embeddings.position_embeddings.weight"] = torch.randn(64, 32, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.bin")
    d = json.loads(cfg.to_json_string())
    for key in ("architectures", "legacy", "transformers_version", "dtype", "torch_dtype"):
        d.pop(key, None)
    (folder / "config.json").write_text(json.dumps(d, indent=2))
    return sentencepiece_folder(folder)


def pruned_and_masked(model, ids, types, mask, gone: dict[int, list[int]], layers: int = 2, heads: int = 4):
    """(pruned copy, its output, the original's output with the `gone` heads masked): what a pruning test compares."""
    head_mask = torch.ones(layers, heads)
    for layer, hs in gone.items():
        head_mask[layer, hs] = 0
    with torch.no_grad():
        ref = model(ids, types, mask, head_mask=head_mask)
        small = prune_heads(copy.deepcopy(model), gone)
        out = small(ids, types, mask)
    return small, out, ref


def save_wide(model, tok, folder):
    """Draw `model`'s weights wide (std 0.3, biases moved by 0.1) so that every attention pattern is sharp,
    and save it and `tok` into `folder` with transformers; the folder."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The largest absolute difference of `a` and `b`, over the positions `mask` keeps (all when None)."""
    d = (a - b).detach().abs()
    if mask is not None:
        d = d[mask.bool()]
    return float(d.max())


def word_tokenizer(folder, words) -> Tokenizer:
    """A WordPiece tokenizer whose vocabulary is BERT's special tokens, "." and `words` (one piece a word),
    written into `folder`: tiny next-token and masking runs whose words are all known."""
    from pathlib import Path

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]
    (Path(folder) / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)
