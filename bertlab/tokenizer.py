"""WordPiece tokenizer on top of `tokenizers`: sentences and pairs, segment ids, word ids,
character offsets; never pads or truncates behind your back."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import torch
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.implementations import BertWordPieceTokenizer

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# role -> token; WordPiece's by default, a folder's tokenizer_config.json / special_tokens_map.json
# names others (RoBERTa's <s> </s> <pad> <unk> <mask>, ALBERT's <pad> <unk>).
# tokenizer_class -> fn(tokenizer.json dict, tokenizer_config dict) -> tokenizer.json dict: the pipeline
# transformers' class builds over the file's (filled by the family modules, e.g. bertlab.families.albert).
TOKENIZER_PIPELINES: dict[str, Callable[[dict, dict], dict]] = {}
# config.json model_type -> tokenizer_class, for a folder whose tokenizer_config.json names none (hub files
# that hold only spm.model do this; transformers' AutoTokenizer then goes by the model type too).
MODEL_TOKENIZERS: dict[str, str] = {}
# tokenizer_class -> role -> token, the roles' tokens when the folder's files name none (GPT-2's tokenizer has
# one special token, <|endoftext|>, for every role: it has no mask, separator or padding token of its own).
TOKENIZER_SPECIALS: dict[str, dict[str, str]] = {}
DEFAULT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
_BRACKETED = re.compile(r"^\[[A-Za-z0-9_]+\]$")  # [CLS], [unused17], ...: tokens that stand for no text


WORDPIECE_PREFIX = "##"  # WordPiece's mark of a piece that continues a word
# How pieces are shown: byte-level BPE's "Ġ" and SentencePiece's "▁" (a space before the piece: it starts
# a word) are drawn as one visible mark, as WordPiece's "##" (the piece continues a word) is shown as is.
WORD_START_MARK = "\u2423"  # ␣


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet: the printable character that stands for each byte (GPT-2's table), reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_LEVEL_CHARS = _byte_level_chars()


def join_wordpieces(pieces: Sequence[str], prefix: str = WORDPIECE_PREFIX) -> str:
    """WordPiece pieces of one word joined back into it: ["play", "##ing"] -> "playing"."""
    return "".join(p[len(prefix):] if i and p.startswith(prefix) else p for i, p in enumerate(pieces))


def spell_specials(template: str, specials: dict[str, str] | None = None) -> str:
    """`template` with {mask}, {unk}, {cls}, {sep}, {pad} spelled as `specials` (role -> token; default:
    WordPiece's), e.g. "The cat sat on the {mask}." -> "The cat sat on the [MASK]."."""
    return template.format(**{**DEFAULT_SPECIALS, **(specials or {})})


class TokenizerError(ValueError):
    """A tokenizer folder or input that cannot be used."""


@dataclass
class Encoding:
    """One encoded sentence or pair. All lists have one entry per token."""

    ids: list[int]
    tokens: list[str]
    type_ids: list[int]  # segment: 0 for [CLS] A [SEP], 1 for B [SEP]
    offsets: list[tuple[int, int]]  # character span in its own sentence (A or B); (0, 0) for specials
    sequence_ids: list[int | None]  # 0 = sentence A, 1 = sentence B, None = special token
    word_ids: list[int | None]  # index of the word within its sentence, None for specials
    special_tokens_mask: list[int]  # 1 for [CLS]/[SEP]
    num_truncated: int = 0  # tokens cut to fit max_length (0 = nothing cut)
    warning: str | None = None  # a sentence for the UI when something was cut

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def truncated(self) -> bool:
        return self.num_truncated > 0

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.ids)

    def word_spans(self) -> list[tuple[int, int, int]]:
        """(sequence id, first token, end token) for each word, in token order."""
        spans: list[tuple[int, int, int]] = []
        prev: tuple[int | None, int | None] = (None, None)
        for i, (s, w) in enumerate(zip(self.sequence_ids, self.word_ids)):
            if w is None:
                prev = (None, None)
                continue
            if (s, w) == prev:
                spans[-1] = (spans[-1][0], spans[-1][1], i + 1)
            else:
                spans.append((s, i, i + 1))  # type: ignore[arg-type]
            prev = (s, w)
        return spans


@dataclass
class Batch:
    """Padded tensors for a list of encodings: each is [batch, seq]."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    encodings: list[Encoding] = field(repr=False)


class Tokenizer:
    """A BERT WordPiece tokenizer: `encode(a, b=None)` -> Encoding."""

    def __init__(self, tok: _HFTokenizer, model_max_length: int = 512, do_lower_case: bool = True,
                 special_tokens: dict[str, str] | None = None, tokenizer_class: str = "BertTokenizer",
                 config: dict | None = None):
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.model_max_length = model_max_length
        self.do_lower_case = do_lower_case
        self.tokenizer_class = tokenizer_class
        self.config = dict(config or {})  # the folder's tokenizer_config.json, written back by save()
        self.special_tokens = {**DEFAULT_SPECIALS, **(special_tokens or {})}  # role -> token
        vocab = tok.get_vocab(with_added_tokens=True)
        missing = [t for t in self.special_tokens.values() if t not in vocab]
        if missing:
            raise TokenizerError(f"the vocabulary lacks the special tokens {missing}.")
        ids = {role: vocab[t] for role, t in self.special_tokens.items()}
        self.pad_token_id = ids["pad"]
        self.unk_token_id = ids["unk"]
        self.cls_token_id = ids["cls"]
        self.sep_token_id = ids["sep"]
        self.mask_token_id = ids["mask"]
        self.mask_token = self.special_tokens["mask"]
        self.unk_token = self.special_tokens["unk"]
        self.cls_token = self.special_tokens["cls"]
        self.sep_token = self.special_tokens["sep"]
        self.pad_token = self.special_tokens["pad"]
        self.special_ids = frozenset(
            (self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id)
        )

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path, model_max_length: int | None = None) -> "Tokenizer":
        """Read `tokenizer.json` if present, else `vocab.txt`, else a SentencePiece `spm.model`
        (+ `tokenizer_config.json`)."""
        folder = Path(folder)
        cfg = _read_json(folder / "tokenizer_config.json")
        if not cfg.get("tokenizer_class"):
            model_type = _read_json(folder / "config.json").get("model_type")
            if model_type in MODEL_TOKENIZERS:
                cfg = {**cfg, "tokenizer_class": MODEL_TOKENIZERS[model_type]}
        lower = bool(cfg.get("do_lower_case", True))
        max_len = model_max_length or _sane_max_length(cfg.get("model_max_length"))
        specials = {**TOKENIZER_SPECIALS.get(str(cfg.get("tokenizer_class")), {}),
                    **_special_tokens(cfg, _read_json(folder / "special_tokens_map.json"))}
        if (folder / "tokenizer.json").is_file():
            try:
                tok = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # tokenizers raises a bare Exception on bad JSON
                raise TokenizerError(f"{folder / 'tokenizer.json'} could not be read: {e}") from e
        elif (folder / "vocab.txt").is_file():
            tok = cls._from_vocab(folder / "vocab.txt", lower, cfg)
        elif (folder / "spm.model").is_file():
            tok = _from_sentencepiece(folder / "spm.model", {**DEFAULT_SPECIALS, **specials})
        else:
            raise TokenizerError(f"{folder} has neither tokenizer.json nor vocab.txt nor spm.model.")
        pipeline = TOKENIZER_PIPELINES.get(str(cfg.get("tokenizer_class")))
        if pipeline is not None:  # the class's own normaliser / pre-tokenizer, as transformers builds it
            tok = _HFTokenizer.from_str(json.dumps(pipeline(json.loads(tok.to_str()), cfg)))
        return cls(tok, model_max_length=max_len, do_lower_case=lower, special_tokens=specials,
                   tokenizer_class=str(cfg.get("tokenizer_class") or "BertTokenizer"), config=cfg)

    @staticmethod
    def _from_vocab(vocab: Path, lower: bool, cfg: dict) -> _HFTokenizer:
        words = set(vocab.read_text(encoding="utf-8").splitlines())
        missing = [t for t in SPECIAL_TOKENS if t not in words]
        if missing:
            raise TokenizerError(f"{vocab} lacks BERT's special tokens {missing}.")
        wp = BertWordPieceTokenizer(
            str(vocab),
            lowercase=lower,
            strip_accents=cfg.get("strip_accents"),
            handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
            clean_text=True,
        )
        return wp._tokenizer

    # -- encoding --------------------------------------------------------------------------
    @property
    def is_wordpiece(self) -> bool:
        return type(self._tok.model).__name__ == "WordPiece"

    @property
    def continuing_prefix(self) -> str | None:
        """WordPiece's mark of a piece that continues a word ("##"); None for other tokenizers."""
        if not self.is_wordpiece:
            return None
        return getattr(self._tok.model, "continuing_subword_prefix", None) or WORDPIECE_PREFIX

    def is_continuation(self, token: str) -> bool:
        """Whether vocabulary piece `token` continues the word before it, read off the piece alone:
        WordPiece's "##ing"; a SentencePiece (Metaspace) piece without its "▁" word-start mark. Byte-level
        BPE cannot tell from the piece (a text's first word has no "Ġ"): False, every piece a start;
        exact word boundaries come from an encoding's word ids."""
        prefix = self.continuing_prefix
        if prefix is not None:
            return token.startswith(prefix) and len(token) > len(prefix)
        if type(self._tok.pre_tokenizer).__name__ != "Metaspace" or token in self.special_tokens.values():
            return False
        return bool(token) and not token.startswith("\u2581")

    def spell(self, template: str) -> str:
        """`template` with {mask}, {unk}, {cls}, {sep}, {pad} spelled as this tokenizer's special tokens."""
        return spell_specials(template, self.special_tokens)

    def join_pieces(self, pieces: Sequence[str]) -> str:
        """The pieces of one word joined back into it: ["play", "##ing"] -> "playing"."""
        prefix = self.continuing_prefix
        if prefix is not None:
            return join_wordpieces(pieces, prefix)
        decoder = self._tok.decoder
        return decoder.decode(list(pieces)).strip() if decoder is not None else "".join(pieces)

    def readable_pieces(self, tokens: Sequence[str]) -> list[str]:
        """Pieces as a student reads them: byte-level BPE's bytes as the characters they spell ("Ã©" -> "é";
        the bytes of an incomplete character as "<0xF0>"), its "Ġ" and SentencePiece's "▁" word-start mark as
        WORD_START_MARK; WordPiece pieces ("##less") and special tokens unchanged."""
        kind = type(self._tok.decoder).__name__ if self._tok.decoder is not None else ""
        if self.continuing_prefix is not None or kind not in ("ByteLevel", "Metaspace"):
            return list(tokens)
        specials = set(self.special_tokens.values())
        out = []
        for t in tokens:
            text = t
            if t in specials:
                pass
            elif kind == "ByteLevel" and all(c in BYTE_LEVEL_CHARS for c in t):
                text = bytes(BYTE_LEVEL_CHARS[c] for c in t).decode("utf-8", errors="surrogateescape")
                text = "".join(f"<0x{ord(c) - 0xDC00:02X}>" if "\udc80" <= c <= "\udcff" else c for c in text)
            elif kind == "Metaspace":
                text = t.replace("\u2581", " ")
            if text is not t and text.startswith(" "):
                text = WORD_START_MARK + text[1:]
            out.append(text)
        return out

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, a: str, b: str | None = None, max_length: int | None = None) -> Encoding:
        """Encode sentence `a` (and `b` as the second segment). Texts longer than
        `max_length` (default: the model's) are cut longest-first, with a warning.
        An empty `b` counts as no second sentence, as in transformers."""
        if not isinstance(a, str) or (b is not None and not isinstance(b, str)):
            raise TokenizerError("encode() takes text (str) for a and b.")
        b = b or None
        max_length = max_length or self.model_max_length
        enc = self._tok.encode(a, b)
        num_truncated = 0
        if len(enc.ids) > max_length:
            num_truncated = len(enc.ids) - max_length
            self._tok.enable_truncation(max_length, strategy="longest_first")
            try:
                enc = self._tok.encode(a, b)
            finally:
                self._tok.no_truncation()
        out = _to_encoding(enc)
        if num_truncated:
            out.num_truncated = num_truncated
            out.warning = (
                f"The text is {len(out) + num_truncated} tokens long; the model reads at most "
                f"{max_length}, so the last {num_truncated} tokens were cut."
            )
            log.warning(out.warning)
        return out

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        max_length: int | None = None,
    ) -> Batch:
        """Encode several texts (or pairs) and pad them to the longest, as tensors."""
        pairs = pairs if pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise TokenizerError(f"{len(texts)} texts but {len(pairs)} second sentences.")
        encs = [self.encode(a, b, max_length) for a, b in zip(texts, pairs)]
        return self.pad(encs)

    def pad(self, encs: Sequence[Encoding]) -> Batch:
        """Right-pad encodings to the longest: [batch, seq] tensors."""
        if not encs:
            raise TokenizerError("nothing to pad: the batch is empty.")
        n = max(len(e) for e in encs)
        ids = torch.full((len(encs), n), self.pad_token_id, dtype=torch.long)
        types = torch.zeros((len(encs), n), dtype=torch.long)
        mask = torch.zeros((len(encs), n), dtype=torch.long)
        for i, e in enumerate(encs):
            ids[i, : len(e)] = torch.tensor(e.ids)
            types[i, : len(e)] = torch.tensor(e.type_ids)
            mask[i, : len(e)] = 1
        return Batch(ids, types, mask, list(encs))

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP], never cut (for corpora; batched in Rust)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def tokenize(self, text: str) -> list[str]:
        """WordPiece pieces of `text` without [CLS]/[SEP]."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        tok = self._tok.id_to_token(int(i))
        if tok is None:
            raise TokenizerError(f"token id {i} is outside the vocabulary of {self.vocab_size}.")
        return tok

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    @cached_property
    def placeholder_ids(self) -> frozenset[int]:
        """Ids of the tokens that stand for no text: the special ones ([CLS], [MASK], ...) and
        placeholders such as [unused17]. Read off the vocabulary once per tokenizer."""
        return self.special_ids | frozenset(i for t, i in self.get_vocab().items() if _BRACKETED.match(t))

    # -- saving ----------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """Write tokenizer.json, vocab.txt and tokenizer_config.json (HF layout)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        if self.is_wordpiece:
            vocab = sorted(self.get_vocab().items(), key=lambda kv: kv[1])
            (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        cfg = {
            **self.config,  # options of the tokenizer's class (add_prefix_space, keep_accents, ...)
            "tokenizer_class": self.tokenizer_class,
            "do_lower_case": self.do_lower_case,
            "model_max_length": self.model_max_length,
            **{f"{role}_token": token for role, token in self.special_tokens.items()},
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# SentencePiece model files (spm.model), read without the sentencepiece package
# ---------------------------------------------------------------------------------------------
def _protobuf_fields(data: bytes):
    """(field number, wire type, value) of one protobuf message: ints for varints, bytes otherwise."""
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            if i >= len(data):
                raise TokenizerError("the SentencePiece model ends mid-field: the file is damaged.")
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value

    while i < len(data):
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            yield number, kind, varint()
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            yield number, kind, data[i:i + size]
            i += size
        elif kind == 2:
            size = varint()
            yield number, kind, data[i:i + size]
            i += size
        else:
            raise TokenizerError(f"the SentencePiece model holds a field of wire type {kind}: the file is damaged.")
        if i > len(data):
            raise TokenizerError("the SentencePiece model ends mid-field: the file is damaged.")


def sentencepiece_pieces(data: bytes) -> tuple[list[tuple[str, float, int]], int]:
    """(pieces as (text, score, type), model type) of a SentencePiece ModelProto: type 1 normal, 2 unknown,
    3 control, 4 user-defined, 6 byte; model type 1 Unigram, 2 BPE."""
    import struct

    pieces: list[tuple[str, float, int]] = []
    model_type = 1
    for number, _, value in _protobuf_fields(data):
        if number == 1:  # ModelProto.pieces
            text, score, kind = "", 0.0, 1
            for n, _, v in _protobuf_fields(value):
                if n == 1:
                    text = v.decode("utf-8")
                elif n == 2:
                    score = struct.unpack("<f", v)[0]
                elif n == 3:
                    kind = v
            pieces.append((text, score, kind))
        elif number == 2:  # ModelProto.trainer_spec
            model_type = next((v for n, _, v in _protobuf_fields(value) if n == 3), 1)
    return pieces, model_type


def _from_sentencepiece(path: Path, specials: dict[str, str]) -> _HFTokenizer:
    """A Unigram tokenizer from `spm.model` as transformers converts it: the pieces and their scores, the
    special tokens marked special (those the file lacks, e.g. [MASK], appended after its pieces)."""
    try:
        pieces, model_type = sentencepiece_pieces(path.read_bytes())
    except (UnicodeDecodeError, TokenizerError) as e:
        raise TokenizerError(f"{path} could not be read as a SentencePiece model: {e}") from e
    if model_type != 1 or not pieces:
        raise TokenizerError(f"{path} is not a SentencePiece Unigram model (bertlab reads Unigram spm.model files).")
    unk = next((i for i, p in enumerate(pieces) if p[2] == 2), None)
    ids = {p[0]: i for i, p in enumerate(pieces)}
    added, extra = [], len(pieces)
    for token in dict.fromkeys(specials.values()):
        if token not in ids:
            ids[token], extra = extra, extra + 1
        added.append({"id": ids[token], "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    model = {"type": "Unigram", "unk_id": unk, "byte_fallback": False,
             "vocab": [[p[0], p[1]] for p in pieces] + [[t["content"], 0.0] for t in added if t["id"] >= len(pieces)]}
    return _HFTokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": sorted(added, key=lambda t: t["id"]),
        "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}))


def _special_tokens(*configs: dict) -> dict[str, str]:
    """role -> token from tokenizer_config.json / special_tokens_map.json (plain strings or
    {"content": ...} entries); later files win."""
    out: dict[str, str] = {}
    for cfg in configs:
        for role in DEFAULT_SPECIALS:
            value = cfg.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and value:
                out[role] = value
    return out


def _to_encoding(enc) -> Encoding:
    seq_ids = enc.sequence_ids
    return Encoding(
        ids=list(enc.ids),
        tokens=list(enc.tokens),
        type_ids=list(enc.type_ids),
        offsets=[tuple(o) for o in enc.offsets],
        sequence_ids=list(seq_ids),
        word_ids=list(enc.word_ids),
        special_tokens_mask=list(enc.special_tokens_mask),
    )


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path} could not be read as JSON: {e}") from e
    return d if isinstance(d, dict) else {}


def _sane_max_length(value) -> int:
    # HF writes a huge sentinel (1e30) when no length is known.
    if isinstance(value, (int, float)) and 0 < value <= 1_000_000:
        return int(value)
    return 512
