"""What every family shares: the `Family` record a family module fills in, the `ModelFamily`
protocol that code above the model core speaks, the base of the family models, and the strict
assembly of a model from a state dict (keys and shapes checked, nothing renamed but the table).

The neutral encoder spec is `BertConfig` with the family's `model_type`: each family maps its own
config.json names onto it (`Family.fields`) and back.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from bertlab.config import PAIR_HEADS, PRETRAINING_HEADS, TASKS, BertConfig, ConfigError
from bertlab.hooks import ActivationCache, GradHookFn, HookFn, HookPoint, NameFilter, hooks, name_hook_points, select
from bertlab.model import (
    ATTN_IMPLEMENTATIONS,
    Adapter,
    AttentionHooks,
    AttnImplementation,
    MissingHeadError,
    ModelOutput,
)
from bertlab.model import decoder_is_tied as ties_decoder  # one rule for every family

# The hook points of one logical layer, by short name, the same in every family.
LAYER_HOOKS = (
    "hook_resid_pre", "hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z",
    "hook_result", "hook_attn_out", "hook_resid_mid", "hook_post", "hook_mlp_out", "hook_resid_post",
)
EMBEDDING_HOOKS = ("hook_word", "hook_token_type", "hook_position", "hook_sum", "hook_out")
SPECIAL_ROLES = ("cls", "sep", "pad", "unk", "mask")
TOKENIZER_TITLES = {"wordpiece": "WordPiece", "bpe": "byte-level BPE", "unigram": "SentencePiece Unigram"}
# How a member knows where each token is (Family.positions), as the Input tab says it.
POSITION_NOTES = {
    "learned": "Each position has a learned position embedding, added to the token's input vector.",
    "rotary": "This model has no position embeddings: it adds nothing for the position to the input vector. "
              "Instead, inside every attention layer, each query and key is turned by an angle that grows with "
              "its position (rotary position embeddings), so the scores depend on how far apart tokens are.",
    "relative": "This model adds no position embeddings to the input vector. Instead, every attention layer "
                "scores each pair of tokens also by their distance (relative position embeddings), apart from "
                "what the tokens say.",
}
POSITION_TITLES = {"learned": "learned position embeddings, added to the input",
                   "rotary": "rotary (queries and keys turned by position, inside attention)",
                   "relative": "relative (token distances scored inside attention)"}
OBJECTIVE_DEMOS = ("pair", "dynamic", "rtd", "distil", "")
HEAD_WORDS = {"mlm": "masked-word prediction (MLM)", "nsp": "next-sentence prediction (NSP)",
              "sop": "sentence-order prediction (SOP)", "rtd": "replaced-token detection (ELECTRA's discriminator)",
              "lm": "next-word prediction (a left-to-right language model)"}
# What a left-to-right (causal) member cannot do, in words: each token reads only the tokens before it.
CAUSAL_REFUSALS = {
    "mlm": "it predicts the next word, not a masked one (a hidden word's right-hand context is out of its sight)",
    "nsp": "it has no sentence-pair head: it never learned whether sentence B follows sentence A",
    "sop": "it has no sentence-pair head: it never learned whether two sentences are in order",
    "rtd": "it has no replaced-token detector (that is ELECTRA's discriminator)",
}
# Checkpoint keys that are never weights: position/segment id buffers of older HF versions.
BUFFER_KEYS = (r"(^|\.)embeddings\.position_ids$", r"(^|\.)embeddings\.token_type_ids$")
RENAMES = ((r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias"))


class FamilyError(ValueError):
    """A checkpoint or config that its family cannot build; the message names the file."""


@dataclass(frozen=True)
class Family:
    """Everything bertlab knows about one architecture, in one place.

    fields: HF config.json name -> BertConfig name (both directions); defaults: HF defaults for keys
    a config.json may leave out; architectures: HF class name -> (pre-training heads, task);
    hook_paths: short hook name -> module path of layer {i} holding it; tied: checkpoint key -> the key
    it repeats when the MLM decoder is tied to the word embeddings (config.json's tie_word_embeddings,
    default true: HF stores them once, bertlab ignores the copies; untied, they are weights of their own);
    head_keys: a key (or alternative keys) that shows each pre-training head is in the file;
    read_state: the family's reading of a file's keys before its model is built (returns the spec to
    build and the state to load: DeBERTa's two MLM-head layouts, its checkpoints' unused RTD head).

    What the lab says about the member (every field has a default, so a module fills only what differs):

    - positions: how the model knows where a token is: "learned" (absolute position embeddings added to
      the input, BERT's), "rotary" (queries and keys turned by a position-dependent angle inside attention,
      no position embeddings) or "relative" (attention scores that read the query-key distance, no position
      embeddings added to the input). positions_note: one sentence for the Input tab on it (default: the
      kind's sentence in POSITION_NOTES).
    - has_segments: whether the member has segment (token-type) embeddings at all (False: A and B are told
      apart only by the separator); a config with fewer than two segment types has none either.
    - objective: its pre-training objective in a few words ("MLM + NSP"); objective_about: what that
      objective changed, one or two sentences; objective_demo: what the Family tab shows of it on the
      sentence: "pair" (the sentence-pair head on the halves), "dynamic" (new masks each epoch), "rtd"
      (generator + discriminator), "distil" (soft targets against a teacher), "" (nothing more).
    - mlm_role: what a checkpoint of this member with an MLM head is: "mlm", or "generator" (ELECTRA's MLM
      is the small generator that feeds the discriminator).
    - changes: what this member changed in the architecture, short phrases for the Family tab
      ("rotary positions", "GeGLU MLP"); empty: nothing beyond what the other fields say.
    - new_fields: fills the config.json dict of a new, randomly initialised model (`new_config`) with
      what only this member has, from the size options {"embedding_size", "shared_layers"}.
    """

    name: str  # model_type
    prefix: str  # the encoder's attribute and key prefix ("roberta")
    model_class: type
    fields: dict[str, str]
    architectures: dict[str, tuple[tuple[str, ...], str | None]]
    hook_paths: dict[str, str]
    head_keys: dict[str, str | tuple[str, ...]]
    pooler_key: str | None
    tokenizer_kind: str  # "wordpiece", "bpe" (byte-level) or "unigram"
    special_tokens: dict[str, str]  # role -> the family's usual token ("mask" -> "<mask>")
    base_keys: tuple[str, ...]  # first parts of a bare encoder's keys (saved without the prefix)
    defaults: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)  # spec values the family always has
    tied: dict[str, str] = field(default_factory=dict)
    check: Callable[[dict], None] | None = None  # family-specific refusals on the raw config
    spec_hook: Callable[[dict, dict], None] | None = None  # fills spec kwargs the table cannot
    head_prefixes: tuple[str, ...] = ()  # parameter-name prefixes of the pre-training heads ("cls.")
    # parameter-name prefix -> the part of the model it is, for the Family tab's parameter bars, where the
    # generic filing (by embeddings / encoder / heads) would put it with parts it is not ("deberta.encoder.
    # rel_embeddings." -> "relative-position embeddings"; the parts: bertlab.analysis.family.PARTS)
    parameter_parts: tuple[tuple[str, str], ...] = ()
    # parameter-name prefixes of a task model's head (what feature-mode fine-tuning trains, with the pooler)
    task_head_prefixes: tuple[str, ...] = ("classifier.", "qa_outputs.")
    hf_hook: Callable[[BertConfig, dict], None] | None = None  # undoes spec_hook when writing config.json
    title: str = ""  # how people write the name ("RoBERTa"); default: name
    read_state: Callable[[BertConfig, dict], tuple[BertConfig, dict]] | None = None
    # head sets no transformers class holds -> the class that reads all of it but one extra head, which
    # transformers leaves unread (DeBERTa-v3's replaced-token detector beside its MLM head)
    unread_heads: dict[tuple[str, ...], str] = field(default_factory=dict)
    # -- what the lab says about it (see the class docstring) ----------------------------------
    positions: str = "learned"  # "learned", "rotary" or "relative"
    positions_note: str = ""  # the Input tab's sentence on positions; default: POSITION_NOTES[positions]
    has_segments: bool = True  # segment (token-type) embeddings exist at all
    objective: str = "MLM"  # the pre-training objective in a few words
    objective_about: str = "masked-word prediction"  # what that objective changed
    objective_demo: str = ""  # "pair", "dynamic", "rtd", "distil" or "" (see the class docstring)
    mlm_role: str = "mlm"  # "mlm", or "generator" when the MLM is a generator feeding a discriminator
    changes: tuple[str, ...] = ()  # architecture changes, short phrases for the Family tab
    new_fields: Callable[[dict, dict], None] | None = None  # (config.json dict, size options) -> None
    # the HF class of a next-token model of this member (BERT: "BertLMHeadModel", the MLM head predicting the
    # next token; causal with config.json's is_decoder); None: the member is never a decoder
    decoder_architecture: str | None = None
    # -- left to right -------------------------------------------------------------------------
    causal: bool = False  # each token reads only itself and the tokens before it (GPT-2): "next word", not "mask"
    # where the embeddings' hook points sit under the prefix ("embeddings" -> "bert.embeddings.hook_word"); ""
    # when the input embeddings are the encoder's own weights (GPT-2's transformer.wte / transformer.wpe)
    embeddings_path: str = "embeddings"
    buffer_keys: tuple[str, ...] = ()  # more checkpoint keys that are never weights (regexes; GPT-2's attn.bias)

    def __post_init__(self) -> None:
        if self.positions not in POSITION_NOTES:
            raise FamilyError(f"{self.name}: positions must be one of {', '.join(POSITION_NOTES)}; "
                              f"got {self.positions!r}.")
        if self.objective_demo not in OBJECTIVE_DEMOS:
            raise FamilyError(f"{self.name}: objective_demo must be one of {OBJECTIVE_DEMOS}; "
                              f"got {self.objective_demo!r}.")

    # -- config.json <-> neutral spec -----------------------------------------------------------
    def spec_from_hf(self, d: dict[str, Any]) -> BertConfig:
        """The neutral spec of a config.json dict (unknown keys kept in `extra` for saving)."""
        if self.check is not None:
            self.check(d)
        archs = d.get("architectures") or [self.bare_architecture]
        if not isinstance(archs, list) or not archs or archs[0] not in self.architectures:
            name = archs[0] if isinstance(archs, list) and archs else archs
            raise ConfigError(
                f"architectures names {str(name)[:60]!r}, which bertlab does not build for model_type "
                f"{self.name!r}; it builds {', '.join(self.architectures)}."
            )
        heads, task = self.architectures[archs[0]]
        self._check_decoder(d)
        kwargs: dict[str, Any] = {"is_decoder": d.get("is_decoder") is True,
                                  "predicts_next": archs[0] == self.decoder_architecture}
        for hf_name, ours in self.fields.items():
            if hf_name in d:
                kwargs[ours] = d[hf_name]
            elif hf_name in self.defaults:
                kwargs[ours] = self.defaults[hf_name]
        kwargs.update(self.fixed)
        if d.get("adapter_size") is not None:  # bertlab's fine-tuning lab: Houlsby adapters
            kwargs["adapter_size"] = d["adapter_size"]
        if self.spec_hook is not None:
            self.spec_hook(d, kwargs)
        id2label = d.get("id2label") if task in ("sequence_classification", "token_classification") else None
        return BertConfig(**kwargs, model_type=self.name, pretraining_heads=heads, task=task,
                          id2label=id2label or {}, extra=dict(d))

    def _check_decoder(self, d: dict[str, Any]) -> None:
        """Refuse a decoder this member cannot be (is_decoder without a decoder class) and cross-attention."""
        if d.get("add_cross_attention") is True:
            raise ConfigError("add_cross_attention is true: bertlab's models have no cross-attention block "
                              "(a seq2seq decoder's); set it to false or leave it out.")
        if d.get("is_decoder") not in (None, True, False):
            raise ConfigError(f"is_decoder must be true or false; got {str(d.get('is_decoder'))[:20]!r}.")
        if d.get("is_decoder") is True and self.decoder_architecture is None:
            raise ConfigError(f"is_decoder is true, but bertlab builds {self.display} as an encoder only "
                              f"(BERT is the member it builds as a decoder: model_type bert, BertLMHeadModel).")

    def hf_from_spec(self, spec: BertConfig) -> dict[str, Any]:
        """The config.json dict of `spec` (what transformers reads back)."""
        d = {k: v for k, v in spec.extra.items() if k not in ("architectures", "adapter_size")}
        for hf_name, ours in self.fields.items():
            d[hf_name] = getattr(spec, ours)
        if spec.adapter_size is not None:
            d["adapter_size"] = spec.adapter_size
        if spec.is_decoder or "is_decoder" in d:
            d["is_decoder"] = spec.is_decoder
        if self.hf_hook is not None:
            self.hf_hook(spec, d)
        d["model_type"] = self.name
        d["architectures"] = [self.architecture_of(spec)]
        if spec.id2label:
            d["id2label"] = {str(k): v for k, v in spec.id2label.items()}
            d["label2id"] = {v: k for k, v in spec.id2label.items()}
        elif spec.task == "question_answering" and "id2label" not in d:
            d["id2label"], d["label2id"] = {"0": "LABEL_0", "1": "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
        return d

    @property
    def display(self) -> str:
        return self.title or self.name

    def bind(self, config: BertConfig) -> "ModelFamily":
        """The protocol object of a model of this family with `config` (what `model.family` returns)."""
        return ModelFamily(self, config)

    def new_config(self, architecture: str, *, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                   max_len: int, pad_token_id: int, embedding_size: int | None = None, shared_layers: bool = False,
                   **extra: Any) -> dict[str, Any]:
        """The config.json dict of a new, randomly initialised model with the heads of HF class
        `architecture` (what transformers would read), under the family's own field names: intermediate
        4 x hidden, room for `max_len` tokens after the family's position offset, and what only the family
        has (`new_fields`). `extra`: more config.json fields, by the family's names."""
        if architecture not in self.architectures:
            raise FamilyError(f"{architecture!r} is not a {self.display} architecture; they are "
                              f"{', '.join(self.architectures)}.")
        hf = {ours: theirs for theirs, ours in self.fields.items()}  # spec name -> the family's config.json name
        shape = {"vocab_size": vocab_size, "hidden_size": hidden_size, "num_hidden_layers": num_layers,
                 "num_attention_heads": num_heads, "intermediate_size": 4 * hidden_size,
                 "pad_token_id": pad_token_id, "max_position_embeddings": max_len}
        d: dict[str, Any] = {"model_type": self.name, "architectures": [architecture],
                             **{hf.get(k, k): v for k, v in shape.items()}, **extra}
        if embedding_size is not None:
            d[hf.get("embedding_size", "embedding_size")] = embedding_size
        if self.new_fields is not None:
            self.new_fields(d, {"embedding_size": embedding_size, "shared_layers": shared_layers})
        offset = self.spec_from_hf(d).position_offset  # positions that count from an offset need room for it
        d[hf.get("max_position_embeddings", "max_position_embeddings")] = max_len + offset
        return d

    @property
    def bare_architecture(self) -> str:
        return next(a for a, (h, t) in self.architectures.items() if not h and t is None)

    def architecture_of(self, spec: BertConfig) -> str:
        if spec.predicts_next and spec.pretraining_heads == ("mlm",) and spec.task is None:
            if self.decoder_architecture is None:
                raise FamilyError(f"{self.display} has no next-token (decoder) architecture.")
            return self.decoder_architecture
        for name, (heads, task) in self.architectures.items():
            if heads == spec.pretraining_heads and task == spec.task:
                return name
        if spec.task is None and spec.pretraining_heads in self.unread_heads:
            return self.unread_heads[spec.pretraining_heads]
        raise FamilyError(f"no {self.name} architecture has heads {spec.pretraining_heads} and task {spec.task}.")

    def holds_head(self, head: str, state: dict) -> bool:
        """Whether a checkpoint's (normalised) keys hold pre-training head `head`."""
        keys = self.head_keys.get(head, ())
        return any(k in state for k in ((keys,) if isinstance(keys, str) else keys))

    # -- hooks ----------------------------------------------------------------------------------
    def hook_name(self, layer: int, short: str) -> str:
        if short not in self.hook_paths:
            raise KeyError(f"no per-layer hook {short!r}; the names are {', '.join(LAYER_HOOKS)}.")
        return self.hook_paths[short].format(i=layer) + short


@dataclass(frozen=True)
class ModelFamily:
    """The protocol analysis, training and panels use instead of family names and literal tokens."""

    family: Family
    config: BertConfig

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def num_layers(self) -> int:
        """Logical layers: ALBERT's shared layer counts once per depth."""
        return self.config.num_hidden_layers

    @property
    def title(self) -> str:
        """The family's name as people write it ("RoBERTa")."""
        return self.family.display

    @property
    def has_segments(self) -> bool:
        """Whether token_type_ids mean anything (DistilBERT has no segment embeddings)."""
        return self.family.has_segments and self.config.type_vocab_size > 1

    @property
    def positions(self) -> str:
        """How the model knows where each token is: "learned", "rotary" or "relative" (Family.positions)."""
        return self.family.positions

    @property
    def positions_title(self) -> str:
        """The kind of positions in a few words, for the Family tab's card."""
        return POSITION_TITLES[self.family.positions]

    @property
    def has_position_embeddings(self) -> bool:
        """Whether a position embedding is added to each token's input vector."""
        return self.family.positions == "learned"

    @property
    def positions_note(self) -> str:
        """One sentence on how the model encodes positions, for the Input tab."""
        return self.family.positions_note or POSITION_NOTES[self.family.positions]

    @property
    def causal(self) -> bool:
        """Whether the model reads left to right (each token sees only itself and the tokens before it): a
        left-to-right member (GPT-2), or a decoder of a two-way one (config.json's is_decoder)."""
        return self.family.causal or self.config.is_decoder

    @property
    def pair_task(self) -> str | None:
        """The task of the model's sentence-pair head: "nsp" (does B follow A?), "sop" (are A and B in
        order?), or None without one."""
        return next((h for h in PAIR_HEADS if h in self.config.pretraining_heads), None)

    @property
    def tokenizer_kind(self) -> str:
        return self.family.tokenizer_kind

    @property
    def tokenizer_title(self) -> str:
        """The tokenizer kind as a lecture names it: "WordPiece", "byte-level BPE", "SentencePiece Unigram"."""
        return TOKENIZER_TITLES.get(self.family.tokenizer_kind, self.family.tokenizer_kind)

    def hook_name(self, layer: int, short: str) -> str:
        """Full hook name of `short` (e.g. "hook_pattern") in logical layer `layer`."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} does not exist: the model has {self.num_layers} layers "
                             f"(0..{self.num_layers - 1}).")
        return self.family.hook_name(layer, short)

    def layer_hook_names(self, short: str) -> list[str]:
        return [self.hook_name(i, short) for i in range(self.num_layers)]

    @property
    def prefix(self) -> str:
        """The encoder's attribute and parameter-name prefix ("bert", "roberta", ...)."""
        return self.family.prefix

    def layer_prefix(self, layer: int) -> str:
        """Parameter/module-name prefix of logical layer `layer` ("bert.encoder.layer.3.")."""
        return self.hook_name(layer, "hook_resid_pre").removesuffix("hook_resid_pre")

    def layer_of(self, name: str) -> int | None:
        """The layer a parameter or hook name belongs to (None outside the layers)."""
        pattern = re.escape(self.family.hook_paths["hook_resid_pre"]).replace(re.escape("{i}"), r"(\d+)")
        m = re.match(pattern, name)
        return int(m.group(1)) if m else None

    @staticmethod
    def is_layer_norm(name: str) -> bool:
        """Whether parameter `name` belongs to a LayerNorm, under any family's name for it ("LayerNorm",
        DistilBERT's "sa_layer_norm", ALBERT's "full_layer_layer_norm", RoBERTa's "lm_head.layer_norm",
        ModernBERT's "attn_norm", "mlp_norm", "final_norm" and "embeddings.norm")."""
        return re.search(r"(LayerNorm|norm)\.(weight|bias)$", name) is not None

    @property
    def pooler_prefix(self) -> str | None:
        """Prefix of the pooler's parameters ("bert.pooler."; DeBERTa's sits outside the encoder: "pooler."),
        None for a family without one."""
        key = self.family.pooler_key
        return None if key is None else key[: key.index("pooler.") + len("pooler.")]

    @property
    def head_prefixes(self) -> tuple[str, ...]:
        """Parameter-name prefixes of the pre-training heads (BERT: ("cls.",))."""
        keys = [k for v in self.family.head_keys.values() for k in ((v,) if isinstance(v, str) else v)]
        return self.family.head_prefixes or tuple(dict.fromkeys(k.split(".")[0] + "." for k in keys))

    @property
    def task_head_prefixes(self) -> tuple[str, ...]:
        """Parameter-name prefixes of the task head: the family's (`Family.task_head_prefixes`, e.g.
        ModernBERT's "head." + "classifier.") and its pooler's, if it has one."""
        pooler = (self.pooler_prefix,) if self.pooler_prefix else ()
        return tuple(dict.fromkeys(self.family.task_head_prefixes + pooler))

    def embedding_part_hook(self, short: str) -> str:
        """Hook name of a part of the embeddings: hook_word, hook_token_type, hook_position, hook_sum, hook_out."""
        if short not in EMBEDDING_HOOKS:
            raise KeyError(f"no embedding hook {short!r}; the names are {', '.join(EMBEDDING_HOOKS)}.")
        return ".".join(p for p in (self.family.prefix, self.family.embeddings_path, short) if p)

    def embeddings(self, model: nn.Module) -> nn.Module:
        """The model's embeddings module: `embeddings(model)(input_ids, token_type_ids)`."""
        return getattr(model, self.family.prefix).embeddings

    @property
    def embedding_hook(self) -> str:
        """The residual stream entering the first layer (HF's hidden_states[0])."""
        return self.hook_name(0, "hook_resid_pre")

    def special_tokens(self, tokenizer) -> dict[str, tuple[str, int]]:
        """role -> (token, id) read from the tokenizer: {"mask": ("<mask>", 4), ...}."""
        return {role: (tok, tokenizer.token_to_id(tok)) for role, tok in tokenizer.special_tokens.items()}

    @staticmethod
    def word_spans(word_ids: Sequence[int | None], sequence_ids: Sequence[int | None] | None = None
                   ) -> list[tuple[int, int]]:
        """(first token, end token) of each word, from the tokenizer's word ids: no "##" or "Ġ" test."""
        seqs = sequence_ids if sequence_ids is not None else [0 if w is not None else None for w in word_ids]
        spans: list[tuple[int, int]] = []
        prev = None
        for i, (s, w) in enumerate(zip(seqs, word_ids)):
            key = None if w is None else (s, w)
            if key is not None and key == prev:
                spans[-1] = (spans[-1][0], i + 1)
            elif key is not None:
                spans.append((i, i + 1))
            prev = key
        return spans

    @staticmethod
    def word_starts(word_ids: Sequence[int | None]) -> list[bool]:
        """True where a token begins a word (False for continuations and special tokens)."""
        return [w is not None and (i == 0 or word_ids[i - 1] != w) for i, w in enumerate(word_ids)]


# ---------------------------------------------------------------------------------------------
# The base of every member's whole model (BERT's too: bertlab.families.bert)
# ---------------------------------------------------------------------------------------------
class FamilyModel(nn.Module):
    """A family's whole model: `model(input_ids, token_type_ids, attention_mask)` -> ModelOutput. What every
    member can do is written here once: hooks and caching, its attention implementation, describe itself,
    require a head, swap heads, check its input, write HF weights and config. A member adds its modules, its
    forward and what only it has. Subclasses call `finish()` last in `__init__`."""

    config: BertConfig
    hook_points: dict[str, HookPoint]
    FAMILY: Family  # set by each family module, where it builds the record

    def __init__(self, config: BertConfig):
        super().__init__()
        self.check_family(config)
        self.config = config

    @classmethod
    def check_family(cls, config: BertConfig) -> None:
        """Refuse (ConfigError) a config of another family: each family's model class builds its own."""
        if not hasattr(cls, "FAMILY"):  # the family modules hand each class its record when they are imported
            raise ConfigError(f"{cls.__name__} has no family record yet: import bertlab.families (bertlab.load "
                              f"and bertlab.training do) before building a model from its class.")
        if config.model_type != cls.FAMILY.name:
            raise ConfigError(f"model_type {str(config.model_type)[:40]!r} is not {cls.FAMILY.name!r}: a "
                              f"{cls.__name__} builds {cls.FAMILY.display} models "
                              f"only (bertlab.load builds any model by its config.json's model_type).")

    def _init_weights(self, m: nn.Module) -> None:
        """HF's initialisation of one module (`self.apply(self._init_weights)`): normal(0, initializer_range)
        weights, zero biases and padding row, LayerNorms at identity."""
        std = self.config.initializer_range
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, Adapter):  # near-identity start (Houlsby et al. 2019); runs after its Linears
            nn.init.normal_(m.down.weight, std=1e-3)
            nn.init.normal_(m.up.weight, std=1e-3)

    def tie_weights(self) -> None:
        """Re-link weights the model shares (BERT's MLM decoder and word embeddings); nothing by default."""

    def lens_input(self, states: torch.Tensor) -> torch.Tensor:
        """Every stage's stream as the MLM head expects it (the logit lens): states [stage, ..., d_model],
        stage 0 the embeddings and the last the encoder's output. Post-norm families (BERT's) hand the
        head normalised streams already: the identity. A pre-norm family normalises the intermediate
        stages with its final norm."""
        return states

    @property
    def family(self):
        """The model's family protocol (`bertlab.families.ModelFamily`): logical layers, hook
        names, special tokens, word boundaries."""
        return self.FAMILY.bind(self.config)

    def hook_names(self) -> list[str]:
        return list(self.hook_points)

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[NameFilter, HookFn]],
              bwd_hooks: Iterable[tuple[NameFilter, GradHookFn]] = ()) -> Iterator["FamilyModel"]:
        """`with model.hooks([(names, fn)], bwd_hooks=[(names, grad_fn)]):` — hooks are removed on exit,
        whatever happens. A backward hook gets (gradient, name) when the block's backward pass runs. While a
        hook is on a point only eager attention computes (the scores, the pattern), the model runs eager."""
        with hooks(self.hook_points, fwd_hooks, bwd_hooks):
            attention = [m for m in self.modules() if isinstance(m, AttentionHooks)]
            before = [m.attn_implementation for m in attention]
            eager = any(m.needs_eager() for m in attention)
            try:
                if eager:
                    self.set_attn_implementation("eager")
                yield self
            finally:
                for m, impl in zip(attention, before):
                    m.attn_implementation = impl

    def run_with_cache(
        self, *args, names: NameFilter = None, layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None, dtype: torch.dtype | None = None, **kwargs
    ) -> tuple[ModelOutput, ActivationCache]:
        """Forward pass that also returns the activations at `names` (default: all hook points).

        layers: keep only the names of these layers (and none outside layers). heads: keep only
        these heads of `hook_scores` / `hook_pattern` ([batch, len(heads), query, key], in that
        order). dtype: store
        floating activations in it (e.g. torch.float16: half the memory). The outputs do not change."""
        picked = select(self.hook_points, names)
        if layers is not None:
            wanted = {self._layer_index(i) for i in layers}
            picked = [n for n in picked if self.family.layer_of(n) in wanted]
        head_list = None if heads is None else [int(h) for h in heads]
        cache = ActivationCache(layers=self.family)

        def store(x: torch.Tensor, name: str) -> None:
            per_head = name.endswith(("hook_pattern", "hook_scores"))
            if head_list is not None and per_head and x.shape[1] != len(head_list):
                x = x[:, head_list]  # a family whose attention computes every head
            x = x.detach()
            cache[name] = x.to(dtype) if dtype is not None and x.is_floating_point() else x

        if head_list is not None:
            self._check_heads(head_list, [m for m in self.modules() if isinstance(m, AttentionHooks)])
        with self.hooks([(picked, store)]):
            out = self(*args, **kwargs)
        return out, cache

    def _layer_index(self, i: int) -> int:
        n = self.family.num_layers
        if not -n <= int(i) < n:
            raise IndexError(f"layer {i} does not exist: this model has layers 0..{n - 1}.")
        return int(i) % n

    @staticmethod
    def _check_heads(heads: list[int], attention: list[AttentionHooks]) -> None:
        n = min((m.n_heads for m in attention), default=0)
        bad = [h for h in heads if not 0 <= h < n]
        if bad:
            raise IndexError(f"head {bad[0]} does not exist: each layer has heads 0..{n - 1}.")

    def set_attn_implementation(self, name: AttnImplementation) -> None:
        """Every attention layer's implementation: "sdpa" (the default) or "eager" (transformers' names)."""
        if name not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {name!r}.")
        for m in self.modules():
            if isinstance(m, AttentionHooks):
                m.attn_implementation = name

    def finish(self) -> None:
        """Initialise (unless on the meta device) and name the hook points; call last in __init__."""
        if not any(p.is_meta for p in self.parameters()):
            self.apply(self._init_weights)
        self.hook_points = name_hook_points(self)

    # -- what it has ------------------------------------------------------------------------
    @property
    def heads(self) -> tuple[str, ...]:
        return self.config.pretraining_heads

    @property
    def has_mlm(self) -> bool:
        return "mlm" in self.heads

    @property
    def has_nsp(self) -> bool:
        """A sentence-pair head (NSP, or ALBERT's SOP): its logits come back as `nsp_logits`."""
        return "nsp" in self.heads or "sop" in self.heads

    @property
    def has_rtd(self) -> bool:
        return "rtd" in self.heads

    @property
    def has_lm(self) -> bool:
        """A next-word head: a left-to-right member's LM head (GPT-2's logits come back as `lm_logits`), or an
        MLM head trained to predict the next token (config.predicts_next: BertLMHeadModel, its `mlm_logits`)."""
        return "lm" in self.heads or (self.config.predicts_next and self.has_mlm)

    def next_token_logits(self, states: torch.Tensor) -> torch.Tensor:
        """The next-word head on hidden states [..., hidden] (the last layer's output) -> logits [..., vocab]
        (position i's guess of token i + 1); a left-to-right member defines it (the forward pass and the
        next-token lens call it); a next-token BERT's is its MLM head."""
        if self.config.predicts_next and self.has_mlm:
            return self.mlm_head(states)
        self.require("lm")
        raise NotImplementedError(f"{type(self).__name__} defines no next_token_logits")

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states [..., hidden] -> logits [..., vocab]; each family with one
        defines it (the forward pass and the logit lens both call it)."""
        self.require("mlm")
        raise NotImplementedError(f"{type(self).__name__} defines no mlm_head")

    def require(self, head: str) -> None:
        """Raise a MissingHeadError a student can act on when pre-training head `head` is absent, or task
        head `head` (a fine-tuning task) is one the family has no architecture for. A left-to-right member
        refuses what it cannot do in plain words (it predicts the next word, not a masked one)."""
        if head in TASKS:
            why = self.cannot_hold(head)
            if why:
                raise MissingHeadError(why)
            return
        has = {"mlm": self.has_mlm, "nsp": self.has_nsp, "sop": self.has_nsp, "rtd": self.has_rtd,
               "lm": self.has_lm}.get(head)
        if has is None:
            raise ValueError(f"unknown head {head!r}; heads are {', '.join(PRETRAINING_HEADS)}.")
        if not has and self.cannot_hold(head):
            raise MissingHeadError(self.cannot_hold(head))
        if not has:
            raise MissingHeadError(
                f"this {self.FAMILY.display} model has no {head.upper()} head, so {HEAD_WORDS[head]} is not "
                f"available. Train one in the pre-training tab, or load a checkpoint that has it."
            )

    def cannot_hold(self, head: str) -> str | None:
        """Why no model of this family can have head `head` (a pre-training head or a task), in words a
        student can act on; None when one can (or could, once trained)."""
        fam = self.FAMILY
        if head in TASKS:
            if any(t == head for _, t in fam.architectures.values()):
                return None
            what = head.replace("_", " ")
            why = (f"{fam.display} reads left to right: no token has read the whole text, and bertlab builds no "
                   f"{fam.display} {what} head" if fam.causal else f"bertlab builds no {fam.display} {what} head")
            return f"{why}. Fine-tune a two-way encoder (BERT, RoBERTa, ...) for this task."
        if fam.causal and head in CAUSAL_REFUSALS:
            return (f"{fam.display} reads left to right: {CAUSAL_REFUSALS[head]}. Load a two-way encoder (BERT, "
                    f"RoBERTa, ...) for {HEAD_WORDS[head]}.")
        return None

    def describe(self) -> str:
        """One line for the UI: family, size and heads."""
        c = self.config
        heads = [h.upper() for h in c.pretraining_heads] + ([c.task.replace("_", " ")] if c.task else [])
        n = sum(p.numel() for p in self.parameters()) / 1e6
        return (f"{self.FAMILY.name}: {c.num_hidden_layers} layers, {c.hidden_size} wide, {c.num_attention_heads} "
                f"heads, {n:.1f}M parameters; heads: {', '.join(heads) if heads else 'none (encoder only)'}")

    def check_input(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        """Refuse, in words, what the model cannot read: not [batch, seq], longer than its positions, a segment
        id it has no embedding for (looked at on the CPU only: on a GPU the look would wait for the device)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq]; got shape {tuple(input_ids.shape)}.")
        limit = self.config.max_position_embeddings - self.config.position_offset
        if input_ids.shape[1] > limit:
            raise ValueError(f"the input is {input_ids.shape[1]} tokens long; this model reads at most {limit}. "
                             f"Encode with the model's tokenizer, which cuts long texts with a warning.")
        if token_type_ids is None or not token_type_ids.numel() or token_type_ids.device.type != "cpu":
            return
        types = max(self.config.type_vocab_size, 1)
        if int(token_type_ids.max()) >= types:
            raise ValueError(f"this model has {types} segment type(s); got a segment id {int(token_type_ids.max())}.")

    def with_heads(self, pretraining_heads: Sequence[str] = (), task: str | None = None,
                   id2label: dict[int, str] | None = None, adapter_size: int | None = -1,
                   saveable: bool = True) -> "FamilyModel":
        """A new model of this family with this one's encoder weights (copied) and fresh heads (and adapters)
        where new. Only head sets the family has an HF architecture for (so that transformers can read the save),
        unless `saveable` is False (a model only looked at, e.g. a classifier read through an MLM head).
        adapter_size: -1 keeps this model's adapters, None removes them, N adds N-wide ones."""
        cfg = self.config.replace(pretraining_heads=tuple(pretraining_heads), task=task, id2label=dict(id2label or {}),
                                  adapter_size=self.config.adapter_size if adapter_size == -1 else adapter_size)
        if saveable:
            why = next(filter(None, map(self.cannot_hold, (*pretraining_heads, *([task] if task else [])))), None)
            if why:  # what the family can never have, in words (a left-to-right model's MLM head)
                raise FamilyError(why)
            self.FAMILY.architecture_of(cfg)  # refuses a combination no HF class holds
        new = type(self)(cfg)
        ours, theirs = self.state_dict(), new.state_dict()
        kept = {k: v for k, v in ours.items() if k in theirs and v.shape == theirs[k].shape}
        pooler = (self.FAMILY.pooler_key or "<none>").rsplit(".", 2)[0]
        lost = [k for k in theirs if k.startswith(f"{self.FAMILY.prefix}.") and k not in kept and pooler not in k
                and ".adapter." not in k]
        if lost:
            raise FamilyError(f"with_heads lost encoder weights: {few(lost)}")
        theirs.update(kept)  # the encoder and any heads both have; new heads stay freshly initialised
        new.load_state_dict(theirs)
        new.tie_weights()
        return new.train(self.training)

    # -- saving -----------------------------------------------------------------------------
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under the names transformers writes (a bare encoder without its prefix; a tied
        decoder stored once, as the word embeddings)."""
        tied = set(self.FAMILY.tied) if ties_decoder(self.config) else set()
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if k not in tied}
        if self.FAMILY.architecture_of(self.config) == self.FAMILY.bare_architecture:
            state = {k.removeprefix(self.FAMILY.prefix + "."): v for k, v in state.items()}
        return state

    def hf_config(self) -> dict[str, Any]:
        return self.FAMILY.hf_from_spec(self.config)


# ---------------------------------------------------------------------------------------------
# Strict assembly from a state dict
# ---------------------------------------------------------------------------------------------
@dataclass
class Assembly:
    """What `assemble` found (loading turns it into its LoadReport)."""

    heads: tuple[str, ...]
    task: str | None
    missing_heads: tuple[str, ...]


def normalise_keys(family: Family, state: dict[str, torch.Tensor], tie: bool = True) -> dict[str, torch.Tensor]:
    """Drop buffers, rename TF-era LayerNorm names, prefix a bare encoder's keys; when `tie`, drop the
    copies of tied weights (a copy whose original is absent takes its name: old files store the MLM
    bias only as the decoder's)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if any(re.search(p, key) for p in (*BUFFER_KEYS, *family.buffer_keys)):
            continue
        new = key
        for pattern, repl in RENAMES:
            new = re.sub(pattern, repl, new)
        if new.startswith(family.base_keys):
            new = f"{family.prefix}.{new}"
        if new in out:
            raise FamilyError(f"two checkpoint keys map to {new!r} (one is {key!r}).")
        out[new] = value
    if tie:
        for copy, original in family.tied.items():
            if copy in out:
                value = out.pop(copy)
                out.setdefault(original, value)
    return out


def assemble(family: Family, spec: BertConfig, state: dict[str, torch.Tensor], weights_file: Path,
             share: bool = False) -> tuple[FamilyModel, Assembly]:
    """The model `state` holds, built on the meta device and checked strictly: equal key sets after
    the family's table, equal shapes, floating-point weights. Pre-training heads the config names
    but the file lacks are reported, not guessed."""
    tie = ties_decoder(spec)
    state = normalise_keys(family, state, tie)
    check_dtypes(state, weights_file)
    if family.read_state is not None:
        spec, state = family.read_state(spec, state)
    heads = tuple(h for h in PRETRAINING_HEADS if family.holds_head(h, state))
    missing_heads = tuple(h for h in spec.pretraining_heads if h not in heads)
    id2label = spec.id2label
    if spec.task in ("sequence_classification", "token_classification") and not id2label:
        key = next((k for k in state if k.endswith(("classifier.weight", "out_proj.weight"))), None)
        n = state[key].shape[0] if key else 0
        id2label = {i: f"LABEL_{i}" for i in range(n)}
    add_pooler = family.pooler_key is not None and family.pooler_key in state
    spec = spec.replace(pretraining_heads=heads, id2label=id2label, add_pooler=add_pooler)
    try:
        with torch.device("meta"), SkipInit():  # no random init: every weight comes from the file (strict, below)
            model = family.model_class(spec)
    except ConfigError as e:  # what the family's model refuses in the config
        raise FamilyError(f"{weights_file.parent / 'config.json'}: {e}") from e
    check_state(family, model, state, weights_file)
    expected = model.state_dict()
    owned = {}
    for k, v in state.items():
        if v.dtype != expected[k].dtype:
            owned[k] = v.to(expected[k].dtype, memory_format=torch.contiguous_format)
        else:
            owned[k] = v if share else v.clone(memory_format=torch.contiguous_format)
    for copy in tied_in(family, model):  # a tied decoder module (BERT's): the embeddings, re-tied below
        owned[copy] = owned[family.tied[copy]]
    model.load_state_dict(owned, strict=True, assign=True)
    model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FamilyError(f"{weights_file}: {few(left)} got no value from the file.")
    model.eval()
    return model, Assembly(heads, spec.task, missing_heads)


class SkipInit(torch.overrides.TorchFunctionMode):
    """Inside: `torch.nn.init`'s fill functions do nothing. For a model built on the meta device whose
    weights all come from a file (filling meta tensors would only import torch's compiler). A torch
    function mode, so it acts in this thread only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def check_dtypes(state: dict[str, torch.Tensor], weights_file: Path) -> None:
    """Weights must be floating point: integer or bool tensors would load as garbage floats."""
    bad = [f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise FamilyError(
            f"{weights_file} holds non-floating-point weights: {few(bad)}. A model's weights are floats "
            f"(float32/16, bfloat16); the file is damaged or not a model checkpoint."
        )


def tied_in(family: Family, model: nn.Module) -> list[str]:
    """The model's state-dict keys that are tied copies (not read from a file): BERT's decoder weight."""
    if not ties_decoder(model.config):
        return []
    keys = model.state_dict()
    return [k for k in family.tied if k in keys]


def check_state(family: Family, model: nn.Module, state: dict[str, torch.Tensor], weights_file: Path) -> None:
    """Equal key sets (tied copies aside) and equal shapes, or one FamilyError naming them."""
    tied = set(tied_in(family, model))
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in tied}
    if not any(k.startswith(f"{family.prefix}.") for k in state):
        problems = [f"it holds no {family.display} encoder weights (keys such as {few(list(state))}); "
                    f"is it a {family.display} checkpoint (is config.json's model_type right)?"]
    else:
        problems = key_problems(expected, state)
    if problems:
        raise FamilyError(f"{weights_file} does not fit its config.json: " + "; ".join(problems) + ".")


def key_problems(expected: dict[str, torch.Size], state: dict[str, torch.Tensor]) -> list[str]:
    """What keeps `state` from loading into a model whose state dict has `expected` (name -> shape):
    missing weights, unexpected ones, shape mismatches; one line each, empty when it fits."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k} (file {tuple(state[k].shape)}, config {tuple(expected[k])})"
             for k in expected if k in state and state[k].shape != expected[k]]
    problems = []
    if missing:
        problems.append(f"{len(missing)} weight(s) missing: {few(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected weight(s): {few(unexpected)}")
    if wrong:
        problems.append(f"{len(wrong)} shape mismatch(es) with config.json: {few(wrong)}")
    return problems


def few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
