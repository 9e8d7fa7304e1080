"""ELECTRA (Clark et al. 2020): a small generator learns MLM; its samples replace the masked tokens;
a discriminator learns to tell, for every token, whether it was replaced (replaced-token detection).
Loss = generator MLM + λ · discriminator loss, λ = 50 as in the paper. The two share their token,
position and segment embeddings; the generator is a quarter of the discriminator's width (the paper
finds 1/4 to 1/2 best). Kept: the discriminator (`ElectraForPreTraining`); the generator is saved
beside it in `generator/` (`ElectraForMaskedLM`).

Data making is the masking alone (15 %, of which 85 % become the mask token and 15 % stay, as the
ELECTRA code does; no random tokens: the generator supplies the replacements). `sample_replacements`
and `corrupt` turn the generator's logits into the discriminator's input and labels."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.hooks import name_hook_points
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.masking import IGNORE_INDEX, MLMBatch
from bertlab.training.objectives.base import ModelShape, Objective, collator, mlm_loss, new_family_model
from bertlab.training.objectives.roberta import full_sentences

DISC_WEIGHT = 50.0  # λ of the paper
GENERATOR_FRACTION = 4  # generator width = discriminator width / 4
GENERATOR_FOLDER = "generator"


class ElectraPair(nn.Module):
    """Generator + discriminator with shared embeddings; `forward(batch)` -> (loss, metrics)."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module, disc_weight: float = DISC_WEIGHT):
        super().__init__()
        self.generator, self.discriminator, self.disc_weight = generator, discriminator, disc_weight
        encoder = getattr(generator, generator.family.prefix)
        encoder.embeddings = discriminator.family.embeddings(discriminator)  # shared, as in the paper
        generator.hook_points = name_hook_points(generator)  # its embedding hooks are now the shared module's

    def forward(self, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        picked = batch.labels != IGNORE_INDEX  # [batch, seq] masked positions
        gen = self.generator(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked)
        gen_loss, metrics = mlm_loss(gen.mlm_logits, batch.labels[picked])
        sampled = sample_replacements(gen.mlm_logits.detach())  # [n] no gradient through the sampling
        disc_ids, replaced = corrupt(batch.original_ids, picked, sampled)
        disc = self.discriminator(disc_ids, batch.token_type_ids, batch.attention_mask)
        real = batch.attention_mask.bool()  # [batch, seq] padding is not scored
        logits, target = disc.rtd_logits.float()[real], replaced[real].float()
        disc_loss = F.binary_cross_entropy_with_logits(logits, target)
        metrics.update({
            "gen_mlm_loss": metrics.pop("mlm_loss"), "gen_mlm_acc": metrics.pop("mlm_acc"),
            "rtd_loss": disc_loss.detach(), "rtd_acc": ((logits > 0) == target.bool()).float().mean(),
            "replaced_share": target.mean(),
        })
        return gen_loss + self.disc_weight * disc_loss, metrics


def sample_replacements(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of generator logits [n, vocab], sampled from their softmax -> [n]."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    return torch.multinomial(logits.float().softmax(-1), 1, generator=generator).squeeze(1)


def corrupt(original: torch.Tensor, picked: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input [batch, seq]: `original` with the picked positions set to `sampled`
    (in row-major order), and its labels [batch, seq] bool: True where the token differs from the original
    (a sample equal to the original counts as original, as in the paper)."""
    ids = original.clone()
    ids[picked] = sampled.to(ids.dtype)
    return ids, ids != original


def build(shape: ModelShape, tokenizer: Tokenizer) -> ElectraPair:
    """The discriminator at `shape` (embedding 128 at most, as ELECTRA-Small), the generator at 1/4 width."""
    emb = shape.embedding_size or min(128, shape.hidden)
    disc_shape = ModelShape(shape.layers, shape.hidden, shape.heads, emb, False, shape.max_len)
    gen_hidden = max(16, shape.hidden // GENERATOR_FRACTION)
    gen_heads = max(1, shape.heads // GENERATOR_FRACTION)
    gen_shape = ModelShape(shape.layers, gen_hidden, gen_heads, emb, False, shape.max_len)
    discriminator = new_family_model("electra", "ElectraForPreTraining", disc_shape, tokenizer)
    generator = new_family_model("electra", "ElectraForMaskedLM", gen_shape, tokenizer)
    return ElectraPair(generator, discriminator)


def electra_loss(model: nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return model(batch)


def save(pair: nn.Module, tokenizer: Tokenizer, folder: Path) -> Path:
    """The discriminator in `folder`, the generator in `folder/generator`."""
    folder = save_model_atomically(pair.discriminator, tokenizer, folder)
    save_model_atomically(pair.generator, tokenizer, Path(folder) / GENERATOR_FOLDER)
    return folder


OBJECTIVE = Objective(
    name="electra",
    title="ELECTRA: replaced-token detection (λ = 50) on a small MLM generator's guesses",
    teaches=("Learning from every token instead of 15 %: a discriminator spots which tokens a small generator "
             "replaced."),
    model_type="electra",
    hf_class="ElectraForPreTraining",
    own_loss="rtd_loss",
    build=build,
    examples=full_sentences,
    collate=lambda tok, seed: collator(tok, seed, mask_prob=0.85, random_prob=0.0),
    loss=electra_loss,
    kept=lambda pair: pair.discriminator,
    mlm_model=lambda pair: pair.generator,
    save=save,
    size_options=("embedding_size",),
    loss_name="replaced-token",
    mlm_acc_key="gen_mlm_acc",  # its MLM accuracy is the small generator's
    continue_with=None,
    builds="a generator and a discriminator",
)
