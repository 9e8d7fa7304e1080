"""The BERT family on one model core: one module per architecture, one registry, one protocol.

    family = family_for(config_dict["model_type"])   # refuses what it does not know, by name
    spec = family.spec_from_hf(config_dict)          # the neutral encoder spec (a BertConfig)
    model.family.hook_name(3, "hook_pattern")         # the protocol code above the core speaks

Adding a member: write its module (config fields, weight names, heads, tokenizer kind, special
tokens, and what the lab says about it: positions, segments, objective, changes; see `Family`), set
`ModelClass.FAMILY = FAMILY` there (the model finds its protocol through it: the model core never
imports the families), and add it to `FAMILIES`; nothing in analysis, training, viz or panels changes.
"""

from __future__ import annotations

from typing import Any

from bertlab.config import BertConfig, ConfigError
from bertlab.families import albert, bert, deberta, distilbert, electra, gpt2, modernbert, modernbert_decoder, roberta
from bertlab.families.core import (
    LAYER_HOOKS,
    Assembly,
    Family,
    FamilyError,
    FamilyModel,
    ModelFamily,
    assemble,
    check_dtypes,
)

FAMILIES: dict[str, Family] = {f.name: f for f in (bert.FAMILY, roberta.FAMILY, albert.FAMILY,
                                                     distilbert.FAMILY, electra.FAMILY,
                                                     modernbert.FAMILY, deberta.FAMILY, gpt2.FAMILY,
                                                     modernbert_decoder.FAMILY)}


def family_for(model_type: Any) -> Family:
    """The family of a config.json's `model_type`; a ConfigError naming it when bertlab has none."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        shown = str(model_type)[:40]
        raise ConfigError(
            f"model_type {shown!r} is not supported yet: bertlab builds {', '.join(FAMILIES)} encoders."
        )
    return FAMILIES[model_type]


def spec_from_hf(d: dict[str, Any]) -> tuple[Family, BertConfig]:
    """(family, neutral spec) of a config.json dict."""
    if not isinstance(d, dict):
        raise ConfigError("config.json does not hold a JSON object.")
    family = family_for(d.get("model_type", "bert"))
    try:
        return family, family.spec_from_hf(d)
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"a field has the wrong type ({str(e)[:80]}).") from e


def model_family(model) -> ModelFamily:
    """The protocol object of a loaded model (any family)."""
    return family_for(model.config.model_type).bind(model.config)


__all__ = ["FAMILIES", "LAYER_HOOKS", "Assembly", "Family", "FamilyError", "FamilyModel", "ModelFamily",
           "assemble", "check_dtypes", "family_for", "model_family", "spec_from_hf"]
