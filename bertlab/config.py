"""BertConfig: the shape of a BERT-family model, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Pre-training heads a family can have: masked LM, next-sentence / sentence-order prediction,
# replaced-token detection (ELECTRA's discriminator), a left-to-right LM's next-word head (GPT-2's).
PRETRAINING_HEADS = ("mlm", "nsp", "sop", "rtd", "lm")
# The sentence-pair heads among them (next-sentence / sentence-order prediction): both answer in `nsp_logits`.
PAIR_HEADS = ("nsp", "sop")
# Sizes past these are not a model bertlab can run in a class: refused before anything is built.
LIMITS = {"num_hidden_layers": 256, "hidden_size": 32768, "intermediate_size": 131072,
          "num_attention_heads": 1024, "vocab_size": 4_000_000, "max_position_embeddings": 1_000_000}

# Task heads a model can carry besides (or instead of) the pre-training heads.
TASKS = ("sequence_classification", "token_classification", "question_answering")

# HF `architectures` name -> (pre-training heads, task) it implies.
ARCHITECTURES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "BertModel": ((), None),
    "BertForPreTraining": (("mlm", "nsp"), None),
    "BertForMaskedLM": (("mlm",), None),
    "BertForNextSentencePrediction": (("nsp",), None),
    "BertForSequenceClassification": ((), "sequence_classification"),
    "BertForTokenClassification": ((), "token_classification"),
    "BertForQuestionAnswering": ((), "question_answering"),
}


class ConfigError(ValueError):
    """A config.json that bertlab cannot build a model from."""


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder, with the field names of HF's `config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    model_type: str = "bert"  # the family (bertlab.families); BERT is whose config.json this class reads
    # Family hooks (designed for, not used by plain BERT): factorised embeddings
    # (ALBERT, ELECTRA) and the position offset RoBERTa uses (padding_idx + 1).
    embedding_size: int | None = None
    position_offset: int = 0
    # Heads: which pre-training heads exist ("mlm", "nsp"), which task head, its labels.
    pretraining_heads: tuple[str, ...] = ()
    task: str | None = None
    id2label: dict[int, str] = field(default_factory=dict)
    add_pooler: bool = True
    # ALBERT: how many distinct layers (groups) the logical layers share (1 = one layer for all depths).
    num_hidden_groups: int = 1
    # Houlsby bottleneck adapters after attention and after the MLP (None = no adapters).
    adapter_size: int | None = None
    # A decoder (config.json's is_decoder): each position reads itself and its left only (a causal mask).
    is_decoder: bool = False
    # The MLM head predicts the next token, not a masked one (HF's BertLMHeadModel; causal when is_decoder).
    predicts_next: bool = False
    # Anything else config.json held, kept so that saving round-trips it.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model_type, str) or not self.model_type:
            raise ConfigError(f"model_type must name a family; got {str(self.model_type)[:40]!r}.")
        self._check_sizes()
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}."
            )
        if self.hidden_act not in ("gelu", "gelu_new", "relu", "gelu_pytorch_tanh"):
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported.")
        if self.task is not None and self.task not in TASKS:
            raise ConfigError(f"task {self.task!r} is not one of {TASKS}.")
        self.pretraining_heads = tuple(h for h in PRETRAINING_HEADS if h in self.pretraining_heads)
        if not isinstance(self.id2label, dict):
            raise ConfigError("id2label must map label numbers to names, e.g. {\"0\": \"negative\"}.")
        try:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        except (TypeError, ValueError):
            bad = next(k for k in self.id2label if not str(k).strip().lstrip("-").isdigit())
            raise ConfigError(
                f"id2label key {str(bad)[:20]!r} is not a label number: keys must be 0, 1, 2, ..."
            ) from None

    def _check_sizes(self) -> None:
        """Whole, positive, sane sizes: checked before anything is allocated."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_hidden_groups",
                     "embedding_size"):
            value = getattr(self, name)
            if value is None and name == "embedding_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number; got {str(value)[:30]!r}.")
            low = 0 if name == "type_vocab_size" else 1
            if value < low:
                raise ConfigError(f"{name} must be at least {low}; got {value}.")
            if name in LIMITS and value > LIMITS[name]:
                raise ConfigError(
                    f"{name} is {value}, more than bertlab runs (at most {LIMITS[name]}): "
                    f"the config is damaged or not a BERT-family encoder."
                )
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ConfigError(f"num_hidden_groups {self.num_hidden_groups} does not divide "
                              f"num_hidden_layers {self.num_hidden_layers}.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        if self.task == "question_answering":
            return 2
        return len(self.id2label)

    @property
    def architecture(self) -> str:
        """The HF class name that holds exactly this model's weights."""
        for name, (heads, task) in ARCHITECTURES.items():
            if heads == self.pretraining_heads and task == self.task:
                return name
        raise ConfigError(
            f"no single HF architecture has heads {self.pretraining_heads} and task {self.task}."
        )

    # -- HF config.json -------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "BertConfig":
        """Build from the dict of an HF `config.json` (unknown keys are kept in `extra`)."""
        own = {f.name for f in dataclasses.fields(cls)} - {"extra", "pretraining_heads", "task", "predicts_next"}
        kwargs = {k: v for k, v in d.items() if k in own}
        kwargs.setdefault("model_type", d.get("model_type", cls.model_type))
        if d.get("model_type", cls.model_type) != cls.model_type:
            raise ConfigError(f"model_type {str(d.get('model_type'))[:40]!r} is read by bertlab.families, not "
                              f"BertConfig (bertlab.loading.load does this for you).")
        archs = d.get("architectures") or ["BertModel"]
        if not isinstance(archs, list) or archs[0] not in ARCHITECTURES:
            raise ConfigError(
                f"architectures names {str(archs[0] if isinstance(archs, list) else archs)[:60]!r}, which bertlab "
                f"does not build; it builds {', '.join(ARCHITECTURES)}."
            )
        heads, task = ARCHITECTURES[archs[0]]
        if "id2label" in d and task in ("sequence_classification", "token_classification"):
            kwargs["id2label"] = d["id2label"]
        else:
            kwargs.pop("id2label", None)
        extra = {k: v for k, v in d.items() if k not in own and k not in ("architectures", "label2id")}
        return cls(**kwargs, pretraining_heads=heads, task=task, extra=extra)

    def to_hf_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name in ("extra", "pretraining_heads", "task", "add_pooler", "position_offset", "predicts_next"):
                continue
            if f.name == "is_decoder" and not self.is_decoder:
                continue
            if f.name == "num_hidden_groups" and value_is_default(self, f.name):
                continue
            value = getattr(self, f.name)
            if f.name in ("embedding_size", "adapter_size") and value is None:
                continue
            if f.name == "id2label":
                if not value:
                    continue
                d["id2label"] = {str(k): v for k, v in value.items()}
                d["label2id"] = {v: k for k, v in value.items()}
                continue
            d[f.name] = value
        d["architectures"] = [self.architecture]
        return d

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not text (UTF-8): it is damaged or not a config.json.") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path} could not be read as JSON: {e}") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{path} does not hold a JSON object.")
        try:
            return cls.from_hf_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{path}: a field has the wrong type ({str(e)[:80]}).") from e

    def save(self, folder: str | Path) -> None:
        Path(folder, "config.json").write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")

    def replace(self, **changes: Any) -> "BertConfig":
        return dataclasses.replace(self, **changes)


def value_is_default(config: BertConfig, name: str) -> bool:
    """Whether `config.name` still has the dataclass default (such fields are left out of config.json)."""
    f = BertConfig.__dataclass_fields__[name]
    return getattr(config, name) == f.default
