"""DeBERTa-v3 (He et al. 2021): ELECTRA's replaced-token detection on DeBERTa, with gradient-disentangled
embedding sharing (GDES). A generator (half the discriminator's depth, the same width) learns MLM; its
samples replace the masked tokens; the discriminator learns, for every token, whether it was replaced.
Loss = generator MLM + λ · discriminator loss, λ = 50. The discriminator reads the generator's word
embeddings with no gradient, plus a difference of its own that starts at zero: E_D = sg(E_G) + E_Δ,
so the detector's loss never pulls the generator's table (ELECTRA's full sharing does: a tug of war).

Kept: the discriminator with E_G + E_Δ as its word embeddings and DeBERTa's detector head
(`mask_predictions`), in the layout of the hub's DeBERTa-v3 files: transformers' DebertaV2Model and its
task classes read it (leaving the detector unread). The generator is saved beside it in `generator/`
(DebertaV2ForMaskedLM). Data and masking are ELECTRA's."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.objectives.base import ModelShape, Objective, collator, new_family_model
from bertlab.training.objectives.electra import DISC_WEIGHT, GENERATOR_FOLDER, ElectraPair, electra_loss
from bertlab.training.objectives.roberta import full_sentences

# DeBERTa-v3's own settings: relative positions only (log buckets), shared attention keys, no segments
V3_CONFIG = {"relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
             "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
             "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7, "hidden_act": "gelu"}


class GdesEmbedding(nn.Module):
    """The discriminator's word embeddings under GDES: the generator's table without its gradient plus
    `delta` (E_Δ), zero at the start. `weight` [vocab, width] is what the discriminator reads."""

    def __init__(self, source: nn.Embedding):
        super().__init__()
        self.source = [source]  # the generator's table, owned (and trained) by the generator
        self.delta = nn.Parameter(torch.zeros_like(source.weight))
        self.padding_idx = source.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        return self.source[0].weight.detach() + self.delta

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)


class DebertaV3Pair(ElectraPair):
    """Generator + discriminator joined by GDES; `forward(batch)` -> (loss, metrics), as ELECTRA's pair."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module, disc_weight: float = DISC_WEIGHT):
        nn.Module.__init__(self)
        self.generator, self.discriminator, self.disc_weight = generator, discriminator, disc_weight
        embeddings = discriminator.family.embeddings(discriminator)
        embeddings.word_embeddings = GdesEmbedding(generator.family.embeddings(generator).word_embeddings)


def build(shape: ModelShape, tokenizer: Tokenizer) -> DebertaV3Pair:
    """The discriminator at `shape`, the generator at half its depth and the same width (the paper's)."""
    settings = {**V3_CONFIG, "position_buckets": min(256, shape.max_len)}
    discriminator = new_family_model("deberta-v2", "DebertaV2Model", shape, tokenizer, **settings).with_heads(("rtd",))
    gen_shape = ModelShape(max(1, shape.layers // 2), shape.hidden, shape.heads, None, False, shape.max_len)
    generator = new_family_model("deberta-v2", "DebertaV2ForMaskedLM", gen_shape, tokenizer, **settings, legacy=False)
    return DebertaV3Pair(generator, discriminator)


def discriminator_of(pair: DebertaV3Pair) -> nn.Module:
    """The discriminator as it is saved: a plain DeBERTa model whose word embeddings are E_G + E_Δ."""
    disc = pair.discriminator
    state = disc.state_dict()
    key = f"{disc.family.prefix}.embeddings.word_embeddings"
    delta = state.pop(f"{key}.delta")
    state[f"{key}.weight"] = pair.generator.family.embeddings(pair.generator).word_embeddings.weight.detach() + delta
    with torch.device("meta"):
        kept = type(disc)(disc.config)
    kept.load_state_dict(state, assign=True)
    return kept.train(disc.training)


def save(pair: nn.Module, tokenizer: Tokenizer, folder: Path) -> Path:
    """The discriminator in `folder`, the generator in `folder/generator`."""
    folder = save_model_atomically(discriminator_of(pair), tokenizer, folder)
    save_model_atomically(pair.generator, tokenizer, Path(folder) / GENERATOR_FOLDER)
    return folder


OBJECTIVE = Objective(
    name="deberta-v3",
    title="DeBERTa-v3: replaced-token detection (λ = 50), gradient-disentangled embeddings",
    teaches=("ELECTRA's replaced-token detection on DeBERTa, with the generator's and discriminator's embeddings "
             "kept from pulling against each other."),
    model_type="deberta-v2",
    hf_class="DebertaV2Model",
    own_loss="rtd_loss",
    build=build,
    examples=full_sentences,
    collate=lambda tok, seed: collator(tok, seed, mask_prob=0.85, random_prob=0.0),
    loss=electra_loss,
    kept=discriminator_of,
    mlm_model=lambda pair: pair.generator,
    save=save,
    loss_name="replaced-token",
    mlm_acc_key="gen_mlm_acc",  # its MLM accuracy is the generator's
    continue_with=None,
    builds="a generator and a discriminator",
)
