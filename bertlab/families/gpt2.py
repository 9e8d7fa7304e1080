"""GPT-2: a Transformer that reads left to right, beside BERT on the same core.

What it changes, read top-down as the blocks below:
- causal self-attention: token i reads tokens 0..i only (`bertlab.masks.causal`), so the model can be trained
  to predict the next token of every position at once, and no token ever sees the words to its right;
- the input is the word embeddings plus learned position embeddings (`transformer.wte`, `transformer.wpe`:
  weights of the model itself, not of an `embeddings` module), no segments and no norm;
- pre-norm blocks (`ln_1` before attention, `ln_2` before the MLP) and one `ln_f` after the last block;
- projections are `Conv1D`s (OpenAI's layout): the weight is stored [in, out], `x @ weight + bias`;
- the LM head (`lm_head`) is the word embeddings again (tied), without a bias.

Weight names are transformers' (`modeling_gpt2.py`): `transformer.h.N.attn.c_attn`, `.attn.c_proj`,
`.mlp.c_fc`, `.mlp.c_proj`, `.ln_1`, `.ln_2`, `transformer.ln_f`. Older files keep the causal mask as a buffer
(`h.N.attn.bias`, `h.N.attn.masked_bias`): never weights, ignored. A bare `GPT2Model` file loads with its LM
head, since that head is the word embeddings it holds (transformers' GPT2LMHeadModel reads such a file whole).

The protocol's hook points, plus GPT-2's own `transformer.hook_resid_final` (the stream after the last block,
before `ln_f`). As in transformers' `hidden_states`, the last block's `hook_resid_post` is after `ln_f`. The
embeddings' hook points sit on `transformer` itself (`transformer.hook_word`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.families.core import Family, FamilyModel
from bertlab.hooks import HookPoint
from bertlab.masks import causal
from bertlab.model import Adapter, AttentionHooks, ModelOutput, activation, decoder_is_tied
from bertlab.tokenizer import MODEL_TOKENIZERS, TOKENIZER_PIPELINES, TOKENIZER_SPECIALS

EOS = "<|endoftext|>"  # GPT-2's one special token: the end (and start) of a text, and every other role
ACTIVATIONS = ("gelu_new", "gelu", "relu", "gelu_pytorch_tanh")  # those bertlab.model.activation knows


# ---------------------------------------------------------------------------------------------
# Conv1D: a Linear whose weight is stored [in, out]
# ---------------------------------------------------------------------------------------------
class Conv1D(nn.Module):
    """OpenAI's projection: y = x @ weight + bias, weight [in, out] (a Linear's transposed)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))  # [in, out]
        self.bias = nn.Parameter(torch.zeros(n_out))  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


# ---------------------------------------------------------------------------------------------
# Causal self-attention
# ---------------------------------------------------------------------------------------------
def causal_mask(attention_mask: torch.Tensor | None, seq: int, device: torch.device) -> torch.Tensor:
    """Boolean [batch or 1, 1, query, key], True where a query reads a key: its own position and those to
    its left (`bertlab.masks.causal`), padding hidden."""
    allowed = causal(seq).to(device)[None, None]  # [1, 1, query, key]
    unpadded = attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all()))
    return allowed if unpadded else allowed & attention_mask[:, None, None, :].bool()


class GPT2Attention(AttentionHooks):
    def __init__(self, cfg: BertConfig, index: int):
        super().__init__(cfg)
        self.c_attn = Conv1D(cfg.hidden_size, 3 * cfg.hidden_size)  # q, k, v side by side
        self.c_proj = Conv1D(cfg.hidden_size, cfg.hidden_size)
        self.attn_dropout = nn.Dropout(cfg.attention_probs_dropout_prob)  # on the pattern
        self.resid_dropout = nn.Dropout(cfg.hidden_dropout_prob)  # on the output
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.scale = self.d_head**-0.5 if cfg.extra.get("scale_attn_weights", True) else 1.0
        if cfg.extra.get("scale_attn_by_inverse_layer_idx", False):
            self.scale /= index + 1
        self.hook_result = HookPoint()  # [batch, seq, head, d_model] each head's write (no bias)
        self.hook_attn_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor, mask: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """x [batch, seq, d_model] (after ln_1); mask: boolean [batch or 1, 1, query, key], True where read."""
        qkv = self.c_attn(x).view(*x.shape[:2], 3, self.n_heads, self.d_head)
        q, k, v = (self.hook_q(qkv[:, :, 0]), self.hook_k(qkv[:, :, 1]),
                   self.hook_v(qkv[:, :, 2]))  # [batch, seq, head, d_head]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, seq, d_head]
        if self.uses_eager():
            scores = (q @ k.transpose(-1, -2)) * self.scale  # [batch, head, query, key]
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # nothing to the right
            pattern = self.hook_pattern(self.hook_scores(scores).softmax(dim=-1))  # lower triangular
            z = self.attn_dropout(pattern) @ v
        else:
            p = self.attn_dropout.p if self.training else 0.0
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=self.scale)
        if head_mask is not None:  # [head]: 0 switches a head off
            z = z * head_mask.to(z.dtype).view(1, -1, 1, 1)
        z = self.hook_z(z.transpose(1, 2))  # [batch, seq, head, d_head]
        if self.hook_result.active:
            w = self.c_proj.weight.view(self.n_heads, self.d_head, -1).to(z.dtype)  # [head, d_head, d_model]
            self.hook_result(torch.einsum("bshe,hem->bshm", z, w))
        out = self.hook_attn_out(self.resid_dropout(self.c_proj(z.flatten(2))))
        return out if self.adapter is None else self.adapter(out)


# ---------------------------------------------------------------------------------------------
# MLP and one pre-norm block
# ---------------------------------------------------------------------------------------------
class GPT2MLP(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.c_fc = Conv1D(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = Conv1D(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.hook_post = HookPoint()  # [batch, seq, d_mlp] after the activation
        self.hook_mlp_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.hook_mlp_out(self.dropout(self.c_proj(self.hook_post(self.act(self.c_fc(x))))))
        return out if self.adapter is None else self.adapter(out)


class GPT2Block(nn.Module):
    def __init__(self, cfg: BertConfig, index: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = GPT2Attention(cfg, index)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = GPT2MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model] resid_pre + attention
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model] resid_mid + MLP (the last block: ln_f'ed)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, head_mask: torch.Tensor | None,
                final: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(x + self.attn(self.ln_1(x), mask, head_mask))
        out = mid + self.mlp(self.ln_2(mid))
        return self.hook_resid_post(out if final is None else final(out))


class GPT2Embeddings(nn.Module):
    """The protocol's view of GPT-2's input embeddings (`model.family.embeddings(model)`): `word_embeddings`
    and `position_embeddings` are `transformer.wte` / `transformer.wpe`; calling it runs the model's own
    embedding step (its hook points fire). Made on demand, never a child of the model (its weights keep
    their HF names)."""

    def __init__(self, owner: "GPT2Model"):
        super().__init__()
        self.word_embeddings = owner.wte
        self.position_embeddings = owner.wpe
        object.__setattr__(self, "_owner", owner)  # not a child: the owner holds this view, not the reverse

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self._owner.embed(input_ids)


class GPT2Model(nn.Module):
    """HF `GPT2Model`, stored under `transformer.` in GPT2LMHeadModel."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # [vocab, d_model]
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)  # [positions, d_model]
        self.drop = nn.Dropout(float(cfg.extra.get("embd_pdrop", cfg.hidden_dropout_prob)))
        self.h = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.hook_word = HookPoint()  # [batch, seq, d_model]
        self.hook_token_type = HookPoint()  # never fires: no segment embeddings
        self.hook_position = HookPoint()  # [batch, seq, d_model]
        self.hook_sum = HookPoint()  # [batch, seq, d_model] word + position
        self.hook_out = HookPoint()  # [batch, seq, d_model] after dropout (no norm): the first block's input
        self.hook_resid_final = HookPoint()  # [batch, seq, d_model] after the last block, before ln_f

    @property
    def embeddings(self) -> GPT2Embeddings:
        return GPT2Embeddings(self)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[batch, seq] ids -> [batch, seq, d_model]: word + position embeddings (positions 0, 1, ...)."""
        word = self.hook_word(self.wte(input_ids))
        position = self.hook_position(self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
                                      .expand_as(word))
        return self.hook_out(self.drop(self.hook_sum(word + position)))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                head_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(input_ids)
        mask = causal_mask(attention_mask, x.shape[1], x.device)
        last = len(self.h) - 1
        for i, block in enumerate(self.h):
            x = block(x, mask, None if head_mask is None else head_mask[i], self.finish if i == last else None)
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The stream after the last block, normalised: the model's output."""
        return self.ln_f(self.hook_resid_final(x))


# ---------------------------------------------------------------------------------------------
# The whole model: GPT2LMHeadModel (or a bare GPT2Model)
# ---------------------------------------------------------------------------------------------
@dataclass
class GPT2Output(ModelOutput):
    """ModelOutput plus `lm_logits` [batch, seq, vocab]: position i's guess of token i + 1."""

    lm_logits: torch.Tensor | None = None


class GPT2(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config.replace(add_pooler=False))
        config = self.config
        if config.task is not None:
            raise ConfigError(f"bertlab builds no GPT-2 {config.task.replace('_', ' ')} head: GPT-2 reads left to "
                              f"right, so no token has read the whole text.")
        self.transformer = GPT2Model(config)
        if "lm" in config.pretraining_heads:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied: wte
        self.finish()
        self.tie_weights()

    def _init_weights(self, m: nn.Module) -> None:
        """transformers' initialisation: normal(0, initializer_range) weights (the output projections
        narrower with depth, by 1 / sqrt(2 layers)), zero biases, norms at identity."""
        super()._init_weights(m)
        std = self.config.initializer_range
        if isinstance(m, Conv1D):
            nn.init.normal_(m.weight, std=std)
            nn.init.zeros_(m.bias)
        elif isinstance(m, (GPT2Attention, GPT2MLP)):
            nn.init.normal_(m.c_proj.weight, std=std / (2 * self.config.num_hidden_layers) ** 0.5)

    def tie_weights(self) -> None:
        if getattr(self, "lm_head", None) is not None and decoder_is_tied(self.config):
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> GPT2Output:
        """token_type_ids are accepted (the protocol's call) and ignored: GPT-2 has no segments. mlm_positions
        and all_positions are the protocol's; GPT-2 computes every row (it has no MLM head)."""
        self.check_input(input_ids, None)
        seq = self.transformer(input_ids, attention_mask, head_mask)
        out = GPT2Output(last_hidden_state=seq)
        if self.has_lm:
            out.lm_logits = self.next_token_logits(seq)  # [batch, seq, vocab]
        return out

    def lens_input(self, states: torch.Tensor) -> torch.Tensor:
        """Pre-norm: the head reads the stream after `ln_f`; states [stage, ..., d_model] -> the intermediate
        stages through `ln_f`, the last (the model's output, `ln_f`'ed already) as it is."""
        return torch.cat([self.transformer.ln_f(states[:-1]), states[-1:]])

    def next_token_logits(self, states: torch.Tensor) -> torch.Tensor:
        """The LM head on hidden states `states` [..., hidden] (after ln_f): logits [..., vocab], the guess of
        the token after each position (the next-token lens applies it after every block)."""
        self.require("lm")
        return self.lm_head(states)


# ---------------------------------------------------------------------------------------------
# The tokenizer: byte-level BPE, <|endoftext|> its only special token
# ---------------------------------------------------------------------------------------------
def gpt2_pipeline(tok: dict, cfg: dict) -> dict:
    """GPT-2's tokenizer as transformers' GPT2Tokenizer builds it over tokenizer.json: no normaliser,
    byte-level pre-tokenizer and decoder (the config's add_prefix_space), no special tokens added (a pair is
    A then B, B's segment id 1)."""
    level = {"type": "ByteLevel", "add_prefix_space": bool(cfg.get("add_prefix_space", False)), "trim_offsets": True,
             "use_regex": True}
    seq = [{"Sequence": {"id": "A", "type_id": 0}}]
    return {**tok, "normalizer": None, "pre_tokenizer": level, "decoder": {**level, "add_prefix_space": True},
            "post_processor": {"type": "TemplateProcessing", "single": seq,
                               "pair": [*seq, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}}}


GPT2_SPECIALS = {role: EOS for role in ("cls", "sep", "pad", "unk", "mask")}
for _name in ("GPT2Tokenizer", "GPT2TokenizerFast"):
    TOKENIZER_PIPELINES[_name] = gpt2_pipeline
    TOKENIZER_SPECIALS[_name] = GPT2_SPECIALS
MODEL_TOKENIZERS["gpt2"] = "GPT2Tokenizer"


# ---------------------------------------------------------------------------------------------
# What the registry needs to know
# ---------------------------------------------------------------------------------------------
def _check(d: dict) -> None:
    """GPT-2's own config fields, refused by name when bertlab could not build them."""
    if d.get("add_cross_attention"):
        raise ConfigError("add_cross_attention is set: bertlab builds GPT-2 without cross-attention (no encoder).")
    if d.get("activation_function", "gelu_new") not in ACTIVATIONS:
        raise ConfigError(f"activation_function {str(d.get('activation_function'))[:20]!r} is not supported; "
                          f"bertlab knows {', '.join(ACTIVATIONS)}.")
    inner = d.get("n_inner")
    if inner is not None and (isinstance(inner, bool) or not isinstance(inner, int) or inner < 1):
        raise ConfigError(f"n_inner must be a whole number of at least 1 (or null: 4 x n_embd); "
                          f"got {str(inner)[:20]!r}.")


def _spec(d: dict, kwargs: dict) -> None:
    """n_inner null means 4 x n_embd; the padding id (unused by the model) is the end-of-text one."""
    if kwargs.get("intermediate_size") is None:
        kwargs["intermediate_size"] = 4 * int(kwargs.get("hidden_size", 768))
    eos = d.get("pad_token_id", d.get("eos_token_id"))
    kwargs["pad_token_id"] = eos if isinstance(eos, int) and not isinstance(eos, bool) else 0


FAMILY = Family(
    name="gpt2",
    prefix="transformer",
    model_class=GPT2,
    fields={"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
            "n_head": "num_attention_heads", "n_inner": "intermediate_size", "activation_function": "hidden_act",
            "n_positions": "max_position_embeddings", "layer_norm_epsilon": "layer_norm_eps",
            "initializer_range": "initializer_range", "resid_pdrop": "hidden_dropout_prob",
            "attn_pdrop": "attention_probs_dropout_prob"},
    defaults={"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "activation_function": "gelu_new",
              "n_positions": 1024, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "resid_pdrop": 0.1,
              "attn_pdrop": 0.1},
    fixed={"type_vocab_size": 0},
    spec_hook=_spec,
    check=_check,
    architectures={"GPT2Model": ((), None), "GPT2LMHeadModel": (("lm",), None)},
    hook_paths={
        **{s: "transformer.h.{i}." for s in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")},
        **{s: "transformer.h.{i}.attn." for s in ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern",
                                                  "hook_z", "hook_result", "hook_attn_out")},
        **{s: "transformer.h.{i}.mlp." for s in ("hook_post", "hook_mlp_out")},
    },
    # the LM head is the word embeddings (tied), so every file that has them has it; untied, its own weight
    head_keys={"lm": ("lm_head.weight", "transformer.wte.weight")},
    pooler_key=None,
    tokenizer_kind="bpe",
    special_tokens=GPT2_SPECIALS,
    base_keys=("wte.", "wpe.", "h.", "ln_f."),
    head_prefixes=("lm_head.",),
    parameter_parts=(("transformer.ln_f.", "norms outside the layers"),),
    task_head_prefixes=(),
    tied={"lm_head.weight": "transformer.wte.weight"},
    buffer_keys=(r"(^|\.)attn\.(masked_)?bias$",),  # older files' causal-mask buffers
    title="GPT-2",
    has_segments=False,
    objective="next-word prediction, left to right",
    objective_about="each position learns to guess the token after it, reading only the tokens before it: "
                    "every token of every text is a training example, but no word ever sees its right-hand context",
    changes=("causal attention: each token reads itself and the tokens to its left",
             "pre-norm blocks and a final norm (ln_f)", "Conv1D projections (weights stored [in, out])",
             "no segment embeddings", "LM head tied to the word embeddings, no bias"),
    causal=True,
    embeddings_path="",
)
GPT2.FAMILY = FAMILY

__all__ = ["FAMILY", "GPT2", "Conv1D", "GPT2Output", "causal_mask", "gpt2_pipeline"]
