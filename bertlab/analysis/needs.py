"""What a model lacks for a view (an MLM head, a sentence-pair head, segment or position embeddings),
said in one sentence a student can act on, the same way in every tab."""

from __future__ import annotations

import torch

NEEDS = ("mlm_head", "pair_head", "segment_embeddings", "position_embeddings")


def lacks(model: torch.nn.Module, need: str) -> str | None:
    """What `model` lacks for `need`, in a sentence a student can act on; None when it has it.
    need: "mlm_head" (to guess hidden words), "pair_head" (an NSP or SOP head, to judge a sentence
    pair), "segment_embeddings" (which tell sentence A from B), "position_embeddings" (added to the input;
    without them, what the model uses instead, as its family says it). Every tab says it this one way."""
    family = model.family
    if need == "mlm_head":
        if model.has_mlm:
            return None
        if family.causal:  # a left-to-right model: the words to the right of a hidden one are out of its sight
            return (f"{family.title} reads left to right: it predicts the next word, not a masked one (each word "
                    "sees only the words before it). The Mask tab shows its guesses for the word after your text.")
        why = (" It is an ELECTRA discriminator: it was trained to spot replaced tokens instead (the Mask tab "
               "shows that)." if getattr(model, "has_rtd", False) else "")
        return (f"This {family.name} model has no MLM head, so it cannot guess hidden words.{why} Pick a model "
                "that has one in the model list, or train one in the Pre-training tab.")
    if need == "pair_head":
        if model.has_nsp:
            return None
        if family.causal:
            return (f"{family.title} reads left to right and has no sentence-pair head, so it cannot judge whether "
                    "B follows A; what needs only the model's layers (the attention) still works. Pick a BERT or "
                    "ALBERT model for next-sentence prediction.")
        return (f"This {family.name} model has no sentence-pair head (neither BERT's next-sentence prediction nor "
                "ALBERT's sentence order), so it cannot judge whether B follows A; what needs only the encoder "
                "(the attention) still works. Pick a BERT or ALBERT model, or train an NSP head in the "
                "Pre-training tab.")
    if need == "segment_embeddings":
        if family.has_segments:
            return None
        if family.causal:
            return (f"{family.title} has no segment embeddings and no separator token: it reads A and B as one "
                    "text, B straight after A, each token seeing only the tokens before it.")
        return (f"This {family.name} model has no segment embeddings: it reads A and B as one text, told apart "
                "only by the separator token between them (no segment vector is added to any token).")
    if need == "position_embeddings":
        return None if family.has_position_embeddings else family.positions_note
    raise ValueError(f"unknown need {need!r}; needs are {', '.join(NEEDS)}.")


def pair_task(model: torch.nn.Module) -> str | None:
    """"sop" (ALBERT's sentence order: is A before B?), "nsp" (does B follow A?), or None."""
    return model.family.pair_task if model.has_nsp else None
