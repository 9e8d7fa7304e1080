"""The ModernBERT decoder (the Ettin decoders): ModernBERT's layers, read left to right.

What it changes from the encoder (`bertlab.families.modernbert`, whose blocks it reuses):
- causal self-attention: token i reads tokens 0..i only (`bertlab.masks.causal`), in every layer;
- the local layers are a causal sliding window: token i reads tokens i - w + 1 .. i, w = local_attention // 2
  (transformers' `sliding_window`: "half of the encoder's window", so 128 -> 64 tokens, itself included);
- q, k and v are three projections (`attn.q_proj`, `.k_proj`, `.v_proj`) where the encoder fuses them (`Wqkv`);
- the LM head is the encoder's MLM head under other names: `lm_head` (dense, activation, norm) then `decoder`
  (tied to the word embeddings, with a bias); its logits, position i's guess of token i + 1, come back in
  `out.lm_logits`.

Everything else is the encoder's: normalised word embeddings and no position embeddings (rotary positions,
a global and a local theta), pre-norm layers with bias-free LayerNorms (layer 0 without `attn_norm`), the GeGLU
MLP, one `final_norm`. Weight names are transformers' (`modeling_modernbert_decoder.py`), and so are the hook
points (`model.layers.N.attn.hook_pattern`, `model.hook_resid_final`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.families import modernbert
from bertlab.families.core import Family, FamilyModel
from bertlab.families.modernbert import ModernBert, ModernBertModel, ModernBertPredictionHead, TiedDecoder, option
from bertlab.masks import causal
from bertlab.model import ModelOutput, decoder_is_tied


# ---------------------------------------------------------------------------------------------
# The two causal masks: every key to the left, or the last `window` keys
# ---------------------------------------------------------------------------------------------
def sliding_window(cfg: BertConfig) -> int:
    """How many tokens a local layer's token reads, itself included: local_attention // 2 (transformers')."""
    return int(cfg.extra.get("local_attention", 128)) // 2


def causal_window(n: int, window: int) -> torch.Tensor:
    """A causal sliding window: position i reads positions i - window + 1 .. i. [n, n] bool."""
    return causal(n).triu(1 - window)


def causal_masks(attention_mask: torch.Tensor | None, seq: int, window: int, device: torch.device
                 ) -> dict[str, torch.Tensor]:
    """Boolean masks [batch or 1, 1, query, key], True where a query reads a key, by layer kind: "global"
    `causal`, "local" `causal_window`; padded keys hidden in both."""
    unpadded = attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all()))
    masks = {"global": causal(seq).to(device)[None, None], "local": causal_window(seq, window).to(device)[None, None]}
    if unpadded:
        return masks
    keep = attention_mask[:, None, None, :].bool()  # [batch, 1, 1, key]
    return {kind: mask & keep for kind, mask in masks.items()}


class ModernBertDecoderModel(ModernBertModel):
    """HF `ModernBertDecoderModel`, stored under `model.`: the encoder's modules with q, k, v apart, causal."""

    FUSED = False

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        for layer in self.layers:  # what the views read: a local query sees `window` tokens back (and itself)
            if layer.attn.kind == "local":
                layer.attn.window = sliding_window(cfg) - 1

    def masks(self, attention_mask: torch.Tensor | None, seq: int, device: torch.device
              ) -> dict[str, torch.Tensor | None]:
        return causal_masks(attention_mask, seq, sliding_window(self.config), device)


# ---------------------------------------------------------------------------------------------
# The whole model: ModernBertDecoderForCausalLM (or a bare ModernBertDecoderModel)
# ---------------------------------------------------------------------------------------------
@dataclass
class ModernBertDecoderOutput(ModelOutput):
    """ModelOutput plus `lm_logits` [batch, seq, vocab]: position i's guess of token i + 1."""

    lm_logits: torch.Tensor | None = None


class ModernBertDecoder(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config.replace(add_pooler=False))
        config = self.config
        if config.task is not None:
            raise ConfigError(f"bertlab builds no ModernBERT decoder {config.task.replace('_', ' ')} head: the "
                              f"decoder reads left to right, so no token has read the whole text.")
        self.model = ModernBertDecoderModel(config)
        if "lm" in config.pretraining_heads:
            self.lm_head = ModernBertPredictionHead(config)
            self.decoder = (TiedDecoder(config) if decoder_is_tied(config) else
                            nn.Linear(config.hidden_size, config.vocab_size,
                                      bias=bool(option(config, "decoder_bias", True))))
        self.finish()

    _init_weights = ModernBert._init_weights  # transformers initialises the decoder as the encoder
    lens_input = ModernBert.lens_input  # pre-norm: the stages through final_norm, the last as it is

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModernBertDecoderOutput:
        """token_type_ids are accepted (the protocol's call) and ignored: no segments. mlm_positions and
        all_positions are the protocol's; the decoder computes every row (it has no MLM head)."""
        self.check_input(input_ids, None)
        seq = self.model(input_ids, attention_mask, head_mask)
        out = ModernBertDecoderOutput(last_hidden_state=seq)
        if self.has_lm:
            out.lm_logits = self.next_token_logits(seq)  # [batch, seq, vocab]
        return out

    def next_token_logits(self, states: torch.Tensor) -> torch.Tensor:
        """The LM head on hidden states `states` [..., hidden] (after final_norm): logits [..., vocab], the guess
        of the token after each position (the next-token lens applies it after every layer)."""
        self.require("lm")
        h = self.lm_head(states)
        if isinstance(self.decoder, nn.Linear):
            return self.decoder(h)
        return F.linear(h, self.model.embeddings.tok_embeddings.weight, self.decoder.bias)  # [..., vocab]


# ---------------------------------------------------------------------------------------------
# What the registry needs to know
# ---------------------------------------------------------------------------------------------
FAMILY = Family(
    name="modernbert-decoder",
    prefix="model",
    model_class=ModernBertDecoder,
    fields=modernbert.FAMILY.fields,
    defaults={**modernbert.FAMILY.defaults},
    fixed={"type_vocab_size": 0},
    check=modernbert.FAMILY.check,  # the encoder's refusals: window, layer kinds, rotary, activations
    architectures={"ModernBertDecoderModel": ((), None), "ModernBertDecoderForCausalLM": (("lm",), None)},
    hook_paths={**modernbert.FAMILY.hook_paths},
    head_keys={"lm": "lm_head.dense.weight"},
    pooler_key=None,
    tokenizer_kind="bpe",
    special_tokens=modernbert.FAMILY.special_tokens,
    base_keys=modernbert.FAMILY.base_keys,
    head_prefixes=("lm_head.", "decoder."),
    parameter_parts=modernbert.FAMILY.parameter_parts,
    task_head_prefixes=(),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
    title="ModernBERT decoder",
    positions="rotary",
    has_segments=False,
    objective="next-word prediction, left to right",
    objective_about="the Ettin encoders' recipe (the same data, size and layers) with the other objective: each "
                    "position learns to guess the token after it, reading only the tokens before it",
    changes=("causal attention: each token reads itself and the tokens to its left",
             "local layers a causal sliding window (local_attention / 2 tokens, itself included)",
             "rotary positions (a global and a local theta)", "GeGLU MLP",
             "pre-norm layers with bias-free LayerNorms", "q, k and v projected apart (q_proj, k_proj, v_proj)",
             "no segment embeddings", "LM head: the encoder's MLM head, tied to the word embeddings"),
    causal=True,
)
ModernBertDecoder.FAMILY = FAMILY

__all__ = ["FAMILY", "ModernBertDecoder", "ModernBertDecoderModel", "ModernBertDecoderOutput", "causal_masks",
           "causal_window", "sliding_window"]
