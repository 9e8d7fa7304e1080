"""Which task a model's head does: what the Use-it view, the compression lab and the tabs ask of a
fine-tuned model."""

from __future__ import annotations

import torch

from bertlab.tasks.readers import NLI_LABELS, SST2_LABELS


def model_task(model: torch.nn.Module) -> str | None:
    """The task a model's head calls for: sst2, nli, sts, classification, ner, qa (None = no task head).
    A sequence head with one output predicts a number (transformers' reading of num_labels 1: regression)."""
    cfg = model.config
    if cfg.task == "sequence_classification" and (len(cfg.id2label) == 1
                                                  or cfg.extra.get("problem_type") == "regression"):
        return "sts"
    if cfg.task == "sequence_classification":
        labels = {str(v).lower() for v in cfg.id2label.values()}
        if labels == set(NLI_LABELS.values()):
            return "nli"
        return "sst2" if labels == set(SST2_LABELS.values()) else "classification"
    return {"token_classification": "ner", "question_answering": "qa"}.get(cfg.task)
