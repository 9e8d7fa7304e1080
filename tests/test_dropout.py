"""Attention dropout while training: both implementations (torch's SDPA, the eager products through `nn.Dropout`)
drop about p of the pattern and scale the rest by 1 / (1 - p)."""

from __future__ import annotations

import pytest
import torch

import bertlab.families  # noqa: F401 (hands Bert its family record)
from bertlab.config import BertConfig
from bertlab.families.bert import Bert


def _model(task="token_classification"):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, task=task,
                     id2label={0: "a", 1: "b", 2: "c"})
    return Bert(cfg).train()



@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_dropout_drops_about_p_of_the_attention_weights(impl):
    """With the real masks, the mean of many dropped-out attentions (a training layer's, on a CPU) is the plain
    attention of evaluation (the scaling is right: unscaled, it would be 0.9 of it), and each draw differs from it
    (weights are really dropped)."""
    model = _model()
    model.set_attn_implementation(impl)
    layer = model.bert.encoder.layer[0].attention.self  # attention dropout 0.1, nothing else dropped here
    torch.manual_seed(3)
    for lin in (layer.query, layer.key, layer.value):  # q, k and v of unit scale, as plain random ones
        torch.nn.init.normal_(lin.weight, std=32**-0.5)
    x = torch.randn(8, 16, 32)
    with torch.no_grad():
        plain = layer.eval()(x, None, None)
    layer.train()
    zs = torch.stack([layer(x, None, None).detach() for _ in range(400)])
    error = (zs.mean(0) - plain).abs().mean().item()
    unscaled = (0.1 * plain).abs().mean().item()  # how far the mean would be without the 1 / (1 - p)
    assert error < unscaled / 4, (error, unscaled)
    assert (zs[0] - plain).abs().max() > 0.05
