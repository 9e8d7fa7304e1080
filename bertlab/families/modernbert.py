"""ModernBERT (also mmBERT and the Ettin encoders): what BERT became by 2024.

What it changes, read top-down as the blocks below:
- no segment and no position embeddings: the word embeddings, normalised (`model.embeddings.tok_embeddings`,
  `.norm`); positions enter every layer's attention as rotary embeddings (RoPE) on q and k;
- pre-norm layers with bias-free LayerNorms (`attn_norm`, the identity in layer 0; `mlp_norm`; one
  `final_norm` after the last layer);
- alternating attention: layer i is global when i % global_attn_every_n_layers == 0 (rotary theta
  `global_rope_theta`), otherwise local: each token sees the tokens at most local_attention / 2 away
  (a band; theta `local_rope_theta`);
- fused projections (`attn.Wqkv`, `attn.Wo`) and a GeGLU MLP (`mlp.Wi` gives both halves, `mlp.Wo`);
- MLM without NSP: `head` (dense, activation, norm) then `decoder` (tied to the word embeddings, with a bias);
  the task heads put the same kind of `head` before their `classifier`, sentences pooled by
  [CLS] or by the mean (`classifier_pooling`).

Weight names are transformers' (`modeling_modernbert.py`); config.json is read in both spellings:
the hub's `global_rope_theta` / `local_rope_theta` / `global_attn_every_n_layers` and transformers 5's
`rope_parameters` / `layer_types`.

The protocol's hook points, plus ModernBERT's own: `attn.hook_rot_q` / `hook_rot_k` (q and k after
the rotation), `mlp.hook_pre` / `hook_gate` / `hook_linear` (GeGLU's halves), `model.hook_resid_final`.
As in transformers' `hidden_states`, the last layer's `hook_resid_post` is the encoder's output, after
`final_norm`; the stream before it is `model.hook_resid_final`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.families.core import Family, FamilyModel
from bertlab.hooks import HookPoint
from bertlab.model import Adapter, AttentionHooks, ModelOutput, activation, decoder_is_tied, write_heads

ACTIVATIONS = ("gelu", "gelu_new", "relu", "gelu_pytorch_tanh")  # those bertlab.model.activation knows
THETA = {"global": 160_000.0, "local": 10_000.0}  # transformers' defaults
KINDS = {"full_attention": "global", "sliding_attention": "local"}  # transformers 5's layer_types


# ---------------------------------------------------------------------------------------------
# What the config says beyond the neutral spec (kept in spec.extra, written back as read)
# ---------------------------------------------------------------------------------------------
def layer_kinds(cfg: BertConfig) -> list[str]:
    """"global" or "local" for each layer: config.json's layer_types, else every
    global_attn_every_n_layers-th layer (from layer 0) global."""
    types = cfg.extra.get("layer_types")
    if types:
        return [KINDS[t] for t in types]
    every = int(cfg.extra.get("global_attn_every_n_layers", 3))
    return ["global" if i % every == 0 else "local" for i in range(cfg.num_hidden_layers)]


def rope_theta(cfg: BertConfig, kind: str) -> float:
    """The rotary base of `kind` ("global" / "local") layers: rope_parameters, else global_rope_theta /
    local_rope_theta (a local theta of null means the global one, as older transformers read it)."""
    params = cfg.extra.get("rope_parameters") or {}
    key = "full_attention" if kind == "global" else "sliding_attention"
    if (params.get(key) or {}).get("rope_theta") is not None:
        return float(params[key]["rope_theta"])
    key = f"{kind}_rope_theta"
    if key not in cfg.extra:
        return THETA[kind]
    if cfg.extra[key] is None:  # written as null: the local layers turn as the global ones
        return rope_theta(cfg, "global") if kind == "local" else THETA[kind]
    return float(cfg.extra[key])


def half_window(cfg: BertConfig) -> int:
    """How far a local layer's token sees on each side: local_attention // 2."""
    return int(cfg.extra.get("local_attention", 128)) // 2


def option(cfg: BertConfig, name: str, default: Any) -> Any:
    value = cfg.extra.get(name)
    return default if value is None else value


# ---------------------------------------------------------------------------------------------
# Embeddings: the word embeddings, normalised (nothing else is added)
# ---------------------------------------------------------------------------------------------
class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=option(cfg, "norm_bias", False))
        self.drop = nn.Dropout(float(option(cfg, "embedding_dropout", 0.0)))
        self.hook_word = HookPoint()  # [batch, seq, d_model]
        self.hook_token_type = HookPoint()  # never fires: no segment embeddings
        self.hook_position = HookPoint()  # never fires: positions are rotary, inside attention
        self.hook_sum = HookPoint()  # [batch, seq, d_model] before the norm (the word embeddings alone)
        self.hook_out = HookPoint()  # [batch, seq, d_model] normalised

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The protocol's name for the word embeddings (ModernBERT's `tok_embeddings`)."""
        return self.tok_embeddings

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        total = self.hook_sum(self.hook_word(self.tok_embeddings(input_ids)))
        return self.hook_out(self.drop(self.norm(total)))


# ---------------------------------------------------------------------------------------------
# Rotary positions and the two attention masks
# ---------------------------------------------------------------------------------------------
def rotary(theta: float, d_head: int, seq: int, device: torch.device, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [seq, d_head]: position p turns dimension pair (j, j + d_head/2) by p * theta^(-2j/d_head)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float) / d_head))  # [d_head / 2]
    freqs = torch.arange(seq, device=device).float()[:, None] * inv_freq.to(device)  # [seq, d_head / 2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [seq, d_head]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, head, seq, d_head] turned by the rotary tables [seq, d_head] (computed in float32)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    turned = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + turned * sin).to(x.dtype)


def attention_masks(attention_mask: torch.Tensor | None, seq: int, window: int, device: torch.device
                    ) -> dict[str, torch.Tensor | None]:
    """Boolean masks [batch or 1, 1, query, key], True where a query reads a key, by layer kind:
    "global" hides padding (None when nothing is padded), "local" also every key more than `window`
    tokens away from the query (None when the band covers the whole input)."""
    unpadded = attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all()))
    keep = None if unpadded else attention_mask[:, None, None, :].bool()  # (a GPU is not asked: no device sync)
    if seq - 1 <= window:
        return {"global": keep, "local": keep}
    pos = torch.arange(seq, device=device)
    band = ((pos[:, None] - pos[None, :]).abs() <= window)[None, None]  # [1, 1, query, key]
    return {"global": keep, "local": band if keep is None else band & keep}


# ---------------------------------------------------------------------------------------------
# Attention: fused Wqkv, rotary q and k, global or banded
# ---------------------------------------------------------------------------------------------
class ModernBertAttention(AttentionHooks):
    """fused: one `Wqkv` (the encoder's); otherwise `q_proj`, `k_proj`, `v_proj` (the decoder's, transformers'
    ModernBertDecoderAttention); the rest is the same."""

    def __init__(self, cfg: BertConfig, kind: str, fused: bool = True):
        super().__init__(cfg)
        bias = bool(option(cfg, "attention_bias", False))
        self.kind = kind  # "global" or "local"
        self.window = half_window(cfg) if kind == "local" else None  # tokens seen on each side (a causal one: back)
        self.fused = fused
        if fused:
            self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=bias)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)
            self.k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)
            self.v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)
        self.dropout = nn.Dropout(cfg.attention_probs_dropout_prob)  # on the pattern
        self.out_drop = nn.Dropout(cfg.attention_probs_dropout_prob)  # on the output, as transformers does
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.hook_rot_q = HookPoint()  # [batch, seq, head, d_head] q after the rotation
        self.hook_rot_k = HookPoint()  # [batch, seq, head, d_head] k after the rotation
        self.hook_result = HookPoint()  # [batch, seq, head, d_model] each head's write (no bias)
        self.hook_attn_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                head_mask: torch.Tensor | None) -> torch.Tensor:
        """x [batch, seq, d_model]; rope: (cos, sin) [seq, d_head]; mask: boolean, True where read."""
        q, k, v = self.project(x)  # [batch, seq, head, d_head]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, seq, d_head]
        q = self.hook_rot_q(rotate(q, *rope).transpose(1, 2)).transpose(1, 2)  # turned in [batch, head, ...]
        k = self.hook_rot_k(rotate(k, *rope).transpose(1, 2)).transpose(1, 2)  # layout, as SDPA reads them
        if self.uses_eager():
            scores = (q @ k.transpose(-1, -2)) * self.d_head**-0.5  # [batch, head, query, key]
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            pattern = self.hook_pattern(self.hook_scores(scores).softmax(dim=-1))  # zero outside a local band
            z = self.dropout(pattern) @ v
        else:
            p = self.dropout.p if self.training else 0.0
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        if head_mask is not None:  # [head]: 0 switches a head off
            z = z * head_mask.to(z.dtype).view(1, -1, 1, 1)
        z = self.hook_z(z.transpose(1, 2))  # [batch, seq, head, d_head]
        out = self.hook_attn_out(self.out_drop(write_heads(z, self.Wo, self.hook_result, self.n_heads)))
        return out if self.adapter is None else self.adapter(out)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [batch, seq, d_model] -> q, k, v, each [batch, seq, head, d_head] (their hook points fire)."""
        if self.fused:
            qkv = self.Wqkv(x).view(*x.shape[:2], 3, self.n_heads, self.d_head)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        else:
            q, k, v = (p(x).view(*x.shape[:2], self.n_heads, self.d_head) for p in (self.q_proj, self.k_proj,
                                                                                    self.v_proj))
        return self.hook_q(q), self.hook_k(k), self.hook_v(v)

    def projections(self) -> list[nn.Linear]:
        """The linears that make q, k and v: [Wqkv], or [q_proj, k_proj, v_proj]."""
        return [self.Wqkv] if self.fused else [self.q_proj, self.k_proj, self.v_proj]


# ---------------------------------------------------------------------------------------------
# GeGLU MLP and one pre-norm layer
# ---------------------------------------------------------------------------------------------
class ModernBertMLP(nn.Module):
    """Wi gives two halves (transformers calls them `input` and `gate`): act(first) * second, then Wo."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        bias = bool(option(cfg, "mlp_bias", False))
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.act = activation(cfg.hidden_act)
        self.drop = nn.Dropout(cfg.hidden_dropout_prob)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.hook_pre = HookPoint()  # [batch, seq, d_mlp] first half, before the activation
        self.hook_gate = HookPoint()  # [batch, seq, d_mlp] the gate: act(first half)
        self.hook_linear = HookPoint()  # [batch, seq, d_mlp] second half (transformers' `gate`), no activation
        self.hook_post = HookPoint()  # [batch, seq, d_mlp] gate * second half, what Wo reads
        self.hook_mlp_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.Wi(x).chunk(2, dim=-1)
        gate = self.hook_gate(self.act(self.hook_pre(first)))
        out = self.hook_mlp_out(self.Wo(self.drop(self.hook_post(gate * self.hook_linear(second)))))
        return out if self.adapter is None else self.adapter(out)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, cfg: BertConfig, index: int, kind: str, fused: bool = True):
        super().__init__()
        bias = option(cfg, "norm_bias", False)
        self.attn_norm = nn.Identity() if index == 0 else nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps,
                                                                       bias=bias)  # layer 0: embeddings are normed
        self.attn = ModernBertAttention(cfg, kind, fused)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=bias)
        self.mlp = ModernBertMLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model] resid_pre + attention
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model] resid_mid + MLP (the last layer: final_norm'ed)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                head_mask: torch.Tensor | None, final: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(x + self.attn(self.attn_norm(x), rope, mask, head_mask))
        out = mid + self.mlp(self.mlp_norm(mid))
        return self.hook_resid_post(out if final is None else final(out))


class ModernBertModel(nn.Module):
    """HF `ModernBertModel`, stored under `model.` in full models."""

    FUSED = True  # one Wqkv per layer (the decoder, `modernbert_decoder.ModernBertDecoderModel`, has three)

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        kinds = layer_kinds(cfg)
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i, kind, self.FUSED) for i, kind in enumerate(kinds))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=option(cfg, "norm_bias", False))
        self.hook_resid_final = HookPoint()  # [batch, seq, d_model] the stream after the last layer, before final_norm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                head_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids)
        seq, cfg = x.shape[1], self.config
        masks = self.masks(attention_mask, seq, x.device)
        ropes = {kind: rotary(rope_theta(cfg, kind), cfg.head_dim, seq, x.device, x.dtype)
                 for kind in {layer.attn.kind for layer in self.layers}}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            kind = layer.attn.kind
            x = layer(x, ropes[kind], masks[kind], None if head_mask is None else head_mask[i],
                      self.finish if i == last else None)
        return x

    def masks(self, attention_mask: torch.Tensor | None, seq: int, device: torch.device
              ) -> dict[str, torch.Tensor | None]:
        """The boolean mask of each layer kind ("global", "local"): `attention_masks`, both ways."""
        return attention_masks(attention_mask, seq, half_window(self.config), device)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The stream after the last layer, normalised: the encoder's output."""
        return self.final_norm(self.hook_resid_final(x))


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------
class ModernBertPredictionHead(nn.Module):
    """dense, activation, norm: before the MLM decoder and before every task's classifier."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bool(option(cfg, "classifier_bias", False)))
        self.act = activation(option(cfg, "classifier_activation", "gelu"))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=option(cfg, "norm_bias", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class TiedDecoder(nn.Module):
    """`decoder` tied to the word embeddings: only its bias is stored (none without decoder_bias)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if option(cfg, "decoder_bias", True) else None


class ModernBert(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config.replace(add_pooler=False))
        config = self.config
        if config.task in ("sequence_classification", "token_classification") and config.num_labels < 1:
            raise ValueError(f"a {config.task} head needs labels: set config.id2label.")
        self.model = ModernBertModel(config)
        mlm, task = "mlm" in config.pretraining_heads, config.task
        self.head = ModernBertPredictionHead(config) if mlm or task else None
        if mlm:
            self.decoder = (TiedDecoder(config) if decoder_is_tied(config) else
                            nn.Linear(config.hidden_size, config.vocab_size,
                                      bias=bool(option(config, "decoder_bias", True))))
        if task:
            self.drop = nn.Dropout(float(option(config, "classifier_dropout", 0.0)))
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)  # QA: 2 labels (start, end)
        self.finish()

    def _init_weights(self, m: nn.Module) -> None:
        """transformers' initialisation: truncated normals (± initializer_cutoff_factor std), the output
        projections narrower with depth, the classifier at hidden_size^-0.5; norms at identity. Runs
        after the children (`apply`), so a block's own rule overrides the generic one of its Linears."""
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
            return
        FamilyModel._init_weights(self, m)  # named, not super(): the decoder's model runs this method too
        cfg = self.config
        std_in = cfg.initializer_range
        std_out = cfg.initializer_range / (2.0 * cfg.num_hidden_layers) ** 0.5
        cutoff = float(option(cfg, "initializer_cutoff_factor", 2.0))

        def fill(linear: nn.Module, std: float) -> None:
            nn.init.trunc_normal_(linear.weight, std=std, a=-cutoff * std, b=cutoff * std)
            if getattr(linear, "bias", None) is not None:
                nn.init.zeros_(linear.bias)

        if isinstance(m, ModernBertEmbeddings):
            fill(m.tok_embeddings, std_in)
        elif isinstance(m, (ModernBertMLP, ModernBertAttention)):
            for linear in [m.Wi] if isinstance(m, ModernBertMLP) else m.projections():
                fill(linear, std_in)
            fill(m.Wo, std_out)
        elif isinstance(m, ModernBertPredictionHead):
            fill(m.dense, std_out)
        elif m is self:
            if isinstance(getattr(self, "decoder", None), nn.Linear):
                fill(self.decoder, std_out)
            if getattr(self, "classifier", None) is not None:
                fill(self.classifier, cfg.hidden_size**-0.5)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """token_type_ids are accepted (the protocol's call) and ignored: ModernBERT has no segments; all_positions
        is the protocol's "the heads read only some rows" (`Bert.forward`): ModernBERT computes every row."""
        self.check_input(input_ids, None)
        seq = self.model(input_ids, attention_mask, head_mask)
        out = ModelOutput(last_hidden_state=seq)
        if self.has_mlm:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        task = self.config.task
        if task == "sequence_classification":
            out.logits = self.classifier(self.drop(self.head(self.pool(seq, attention_mask))))  # [batch, labels]
        elif task == "token_classification":
            out.logits = self.classifier(self.drop(self.head(seq)))  # [batch, seq, labels]
        elif task == "question_answering":
            start, end = self.classifier(self.drop(self.head(seq))).unbind(-1)
            out.start_logits, out.end_logits = start.contiguous(), end.contiguous()  # [batch, seq]
        return out

    def pool(self, seq: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """[batch, d_model] of seq [batch, seq, d_model]: the [CLS] vector, or the mean of the real
        tokens' vectors (classifier_pooling "mean")."""
        if option(self.config, "classifier_pooling", "cls") == "cls":
            return seq[:, 0]
        if attention_mask is None:
            return seq.mean(dim=1)
        keep = attention_mask.to(seq.dtype).unsqueeze(-1)  # [batch, seq, 1]
        return (seq * keep).sum(dim=1) / keep.sum(dim=1)

    @property
    def has_mlm(self) -> bool:
        return "mlm" in self.config.pretraining_heads

    def lens_input(self, states: torch.Tensor) -> torch.Tensor:
        """Pre-norm: the stream between layers is not normalised, and the head reads it after `final_norm`;
        states [stage, ..., d_model] -> the intermediate stages through `final_norm`, the last (the
        encoder's output, `final_norm`'ed already) as it is."""
        return torch.cat([self.model.final_norm(states[:-1]), states[-1:]])

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        self.require("mlm")
        h = self.head(states)
        if isinstance(self.decoder, nn.Linear):
            return self.decoder(h)
        return F.linear(h, self.model.embeddings.tok_embeddings.weight, self.decoder.bias)  # [..., vocab]


# ---------------------------------------------------------------------------------------------
# What the registry needs to know
# ---------------------------------------------------------------------------------------------
def _check(d: dict) -> None:
    """ModernBERT's own config fields, refused by name when bertlab could not build them."""
    local = d.get("local_attention", 128)
    if isinstance(local, bool) or not isinstance(local, int) or not 2 <= local <= 1_000_000:
        raise ConfigError(f"local_attention must be a whole number of tokens of at least 2; got {str(local)[:20]!r}.")
    every = d.get("global_attn_every_n_layers", 3)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"global_attn_every_n_layers must be a whole number of at least 1; got {str(every)[:20]!r}.")
    types = d.get("layer_types")
    if types is not None:
        layers = d.get("num_hidden_layers", 22)
        if not isinstance(types, list) or any(t not in KINDS for t in types) or len(types) != layers:
            raise ConfigError(f"layer_types must list {', '.join(KINDS)} once per layer ({layers}); "
                              f"got {str(types)[:60]!r}.")
    for key, params in (d.get("rope_parameters") or {}).items():
        if isinstance(params, dict) and params.get("rope_type", "default") != "default":
            raise ConfigError(f"rope_parameters[{key!r}] asks for rope_type {str(params['rope_type'])[:20]!r}; "
                              f"bertlab builds the default rotary embeddings only.")
    if d.get("rope_scaling"):
        raise ConfigError("rope_scaling is set; bertlab builds ModernBERT's default rotary embeddings only.")
    for key in ("global_rope_theta", "local_rope_theta"):
        value = d.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 1):
            raise ConfigError(f"{key} must be a number above 1; got {str(value)[:20]!r}.")
    for key in ("classifier_activation", "hidden_activation"):
        if d.get(key, "gelu") not in ACTIVATIONS:
            raise ConfigError(f"{key} {str(d.get(key))[:20]!r} is not supported; bertlab knows "
                              f"{', '.join(ACTIVATIONS)}.")
    if d.get("classifier_pooling", "cls") not in ("cls", "mean"):
        raise ConfigError(f"classifier_pooling must be 'cls' or 'mean'; got {str(d.get('classifier_pooling'))[:20]!r}.")
    masked_lm = (d.get("architectures") or [None])[0] == "ModernBertForMaskedLM"
    if masked_lm and d.get("decoder_bias") is False and d.get("tie_word_embeddings", True) is not False:
        raise ConfigError("this ModernBertForMaskedLM has a tied decoder without a bias (decoder_bias false); "
                          "bertlab reads ModernBERT MLM checkpoints whose decoder has its bias, as released.")


FAMILY = Family(
    name="modernbert",
    prefix="model",
    model_class=ModernBert,
    fields={"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
            "num_attention_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
            "hidden_activation": "hidden_act", "max_position_embeddings": "max_position_embeddings",
            "norm_eps": "layer_norm_eps", "pad_token_id": "pad_token_id", "initializer_range": "initializer_range",
            "attention_dropout": "attention_probs_dropout_prob", "mlp_dropout": "hidden_dropout_prob"},
    defaults={"vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
              "intermediate_size": 1152, "hidden_activation": "gelu", "max_position_embeddings": 8192,
              "norm_eps": 1e-5, "pad_token_id": 50283, "initializer_range": 0.02, "attention_dropout": 0.0,
              "mlp_dropout": 0.0},
    fixed={"type_vocab_size": 0},
    architectures={
        "ModernBertModel": ((), None),
        "ModernBertForMaskedLM": (("mlm",), None),
        "ModernBertForSequenceClassification": ((), "sequence_classification"),
        "ModernBertForTokenClassification": ((), "token_classification"),
        "ModernBertForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths={
        **{s: "model.layers.{i}." for s in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")},
        **{s: "model.layers.{i}.attn." for s in ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern",
                                                 "hook_z", "hook_result", "hook_attn_out", "hook_rot_q",
                                                 "hook_rot_k")},
        **{s: "model.layers.{i}.mlp." for s in ("hook_pre", "hook_gate", "hook_linear", "hook_post",
                                                "hook_mlp_out")},
    },
    head_keys={"mlm": "decoder.bias"},
    pooler_key=None,
    tokenizer_kind="bpe",
    special_tokens={"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"},
    base_keys=("embeddings.", "layers.", "final_norm."),
    head_prefixes=("head.", "decoder."),
    parameter_parts=(("model.embeddings.norm.", "norms outside the layers"),
                     ("model.final_norm.", "norms outside the layers")),  # rotary positions: no parameters
    task_head_prefixes=("head.", "classifier."),  # a task model's head: head.dense -> act -> head.norm, classifier
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
    check=_check,
    title="ModernBERT",
    positions="rotary",
    has_segments=False,
    objective="MLM at 30 %, no NSP",
    objective_about="twice BERT's share of pieces hidden (30 %), no next-sentence task, full sentences "
                    "packed across documents, trained on far more text with longer inputs",
    changes=("rotary positions (a global and a local theta)",
             "attention alternates: every few layers global, the others a local band around each token",
             "GeGLU MLP", "pre-norm layers with bias-free LayerNorms", "no segment embeddings"),
)
ModernBert.FAMILY = FAMILY

__all__ = ["FAMILY", "ModernBert", "attention_masks", "half_window", "layer_kinds", "rope_theta", "rotary"]
