"""Which task a model's head does: what the Use-it view, the compression lab and the tabs ask of a
fine-tuned model."""

from __future__ import annotations

import torch

from bertlab.tasks.readers import NLI_LABELS, SST2_LABELS


def model_task(model: torch.nn.Module) -> str | None:
    """The task a model's head calls for: sst2, nli, classification, ner, qa (None = no task head)."""
    cfg = model.config
    if cfg.task == "sequence_classification":
        labels = {str(v).lower() for v in cfg.id2label.values()}
        if labels == set(NLI_LABELS.values()):
            return "nli"
        return "sst2" if labels == set(SST2_LABELS.values()) else "classification"
    return {"token_classification": "ner", "question_answering": "qa"}.get(cfg.task)
