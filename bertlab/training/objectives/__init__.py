"""Pre-training objectives of the BERT family, one module each, and their registry.

    objective = get_objective("electra")
    model = objective.build(ModelShape.of("mini"), tokenizer)
    batch = objective.collate(tokenizer, seed)(objective.examples(docs, tokenizer, 128, seed)[:8])
    loss, metrics = objective.loss(model, batch)

`bertlab.training.pretrain.pretrain(PretrainConfig(objective=...))` runs one on the shared loop.
"""

from __future__ import annotations

from bertlab.training.objectives import albert, bert, causal, deberta, electra, elmo, modernbert, roberta, spanbert
from bertlab.training.objectives.base import SIZES, ModelShape, Objective, ObjectiveError

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (bert.OBJECTIVE, roberta.OBJECTIVE, albert.OBJECTIVE,
                                                        electra.OBJECTIVE, spanbert.OBJECTIVE,
                                                        modernbert.OBJECTIVE, deberta.OBJECTIVE, causal.OBJECTIVE,
                                                        causal.PEEK, elmo.OBJECTIVE)}
DEFAULT_OBJECTIVE = bert.OBJECTIVE.name  # what a run without an objective trains (MLM + a pair head)


def get_objective(name: str) -> Objective:
    """The objective called `name`; an ObjectiveError listing the names otherwise."""
    if name not in OBJECTIVES:
        raise ObjectiveError(f"objective {str(name)[:40]!r} is not one of {', '.join(OBJECTIVES)}.")
    return OBJECTIVES[name]


__all__ = ["DEFAULT_OBJECTIVE", "OBJECTIVES", "SIZES", "ModelShape", "Objective", "ObjectiveError", "get_objective"]
