"""Both ways vs left to right: an encoder (BERT) beside a causal model (GPT-2, a BERT decoder) on one sentence.

- `pick_pair(loaded)`: the first encoder with an MLM head and the first causal model with an LM head;
- `reach(model, enc)`: which positions each position may read, from the model's own mask
  (`bertlab.masks.causal` for a causal model, else `bertlab.masks.bidirectional`, padded keys never);
- `pattern(model, tok, text, layer, head)`: one head's attention pattern on the sentence;
- `both_ways(...)`: all of it for the word the student picked: the encoder's guesses with that word masked
  (it reads both sides) beside the causal model's guesses for the same word's first token from its left.

Everything speaks the family protocol (`model.family.causal`, `hook_pattern`): no family's names here.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

import torch

from bertlab import masks
from bertlab.analysis.family import Loaded, WordChoice, check_sentence, hidden_positions, masked_word, token_cut
from bertlab.analysis.mask import MaskPrediction, next_word_at
from bertlab.inputs import InputError, echo
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tokenizer import Encoding, Tokenizer

ADD_CAUSAL = ("Both ways vs left to right needs a left-to-right (causal) model among the picked ones, beside an "
              "encoder with an MLM head such as BERT. Add one: while online, `bertlab download "
              "openai-community/gpt2` and load it in the model list above, or train one with the causal "
              "objective in the Pre-training tab; then pick it in a Model slot.")
ADD_ENCODER = ("Both ways vs left to right needs an encoder with an MLM head (BERT, RoBERTa, ...) beside the "
               "left-to-right model: pick one in another Model slot.")


def visible(label: str) -> str:
    """A guessed piece with its control characters spelled out ("U+0003"): a byte-level piece may decode to
    one, and a figure cannot draw it."""
    return "".join(f"U+{ord(c):04X}" if unicodedata.category(c) == "Cc" else c for c in label)


def is_causal(model: torch.nn.Module) -> bool:
    """Whether the model reads left to right (GPT-2, or a two-way member built as a decoder)."""
    return bool(model.family.causal)


def pick_pair(loaded: Sequence[Loaded]) -> tuple[Loaded | None, Loaded | None]:
    """(the first encoder with an MLM head, the first causal model with an LM head) among `loaded`."""
    encoder = next((m for m in loaded if not is_causal(m.model) and m.model.has_mlm), None)
    causal = next((m for m in loaded if is_causal(m.model) and m.model.has_lm), None)
    return encoder, causal


def reach(model: torch.nn.Module, enc: Encoding) -> torch.Tensor:
    """[query, key] bool: True where the model's position `query` may read position `key` on `enc`."""
    n = len(enc)
    allowed = masks.causal(n) if is_causal(model) else masks.bidirectional(n)
    keys = torch.tensor(enc.attention_mask, dtype=torch.bool)  # [key]: 1 = token, 0 = padding
    return allowed & keys[None, :]


def encode(model: torch.nn.Module, tok: Tokenizer, text: str) -> Encoding:
    """The sentence as the model reads it (cut to what it can read)."""
    enc = tok.encode(check_sentence(text), max_length=input_limit(model, tok))
    if not enc.word_spans():
        raise InputError("The sentence has no words this tokenizer can read: type a sentence.")
    return enc


def pattern(model: torch.nn.Module, tok: Tokenizer, text: str, layer: int, head: int) -> torch.Tensor:
    """[query, key] float32 on CPU: head `head` of layer `layer`'s attention pattern on `text`."""
    fam = model.family
    heads = model.config.num_attention_heads
    if not 0 <= layer < fam.num_layers:
        raise InputError(f"layer {layer} does not exist: the model has layers 0..{fam.num_layers - 1}.")
    if not 0 <= head < heads:
        raise InputError(f"head {head} does not exist: the model has heads 0..{heads - 1} per layer.")
    enc = encode(model, tok, text)
    name = fam.hook_name(layer, "hook_pattern")
    ids = torch.tensor([enc.ids], device=model_device(model))  # [1, seq]
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(ids, token_type_ids=torch.tensor([enc.type_ids], device=ids.device),
                                        names=[name])
    return cache[name][0, head].to("cpu", torch.float32)  # [query, key]


@dataclass
class Side:
    """One model's side: its pattern, what each position may read, and its guess for the picked word."""

    name: str
    causal: bool
    labels: list[str]  # the sentence's pieces, readable
    pattern: torch.Tensor  # [query, key] float32: the chosen head
    reach: torch.Tensor  # [query, key] bool: the mask the model applies
    position: int | None  # the picked word's first token (None: the model cannot guess it)
    guess: MaskPrediction | None  # the encoder's (masked) or the causal model's (from the left)
    guess_labels: list[str] = field(default_factory=list)  # the guesses, readable
    note: str = ""  # why there is no guess, or what the model saw

    @property
    def reads(self) -> str:
        return "from the left only" if self.causal else "from both sides"


@dataclass
class BothWays:
    """An encoder and a causal model on one sentence, at one layer and head, for one word."""

    text: str
    word: WordChoice
    layer: int
    head: int
    encoder: Side
    causal: Side


def shared_range(a: torch.nn.Module, b: torch.nn.Module) -> tuple[int, int]:
    """(layers, heads) both models have: the layer and head choosers' ranges."""
    return (min(a.family.num_layers, b.family.num_layers),
            min(a.config.num_attention_heads, b.config.num_attention_heads))


def _side(m: Loaded, text: str, word: WordChoice, layer: int, head: int, k: int) -> Side:
    enc = encode(m.model, m.tok, text)
    labels = [p.label for p in token_cut(m.model, m.tok, text).pieces]
    causal = is_causal(m.model)
    side = Side(m.name, causal, labels, pattern(m.model, m.tok, text, layer, head), reach(m.model, enc), None, None)
    positions = hidden_positions(enc, word)
    if not positions:
        cut = " (the model cannot read that far: the text was cut)" if enc.truncated else ""
        side.note = f"this tokenizer has no piece for {echo(word.text)}{cut}."
        return side
    side.position = positions[0]
    if causal:
        if side.position == 0:
            side.note = (f"{echo(word.text)} is its first token: nothing stands to its left, so a left-to-right "
                         "model has nothing to guess it from. Pick a later word.")
            return side
        side.guess = next_word_at(m.model, m.tok, text, side.position, k)
        side.note = f"reads {side.position} token(s) to the left of {echo(word.text)}, nothing after it."
    else:
        mw = masked_word(m.model, m.tok, text, word, k)
        side.guess = mw.first
        side.position = mw.first.position
        side.note = f"reads every token but the {len(mw.pieces)} hidden piece(s) of {echo(word.text)}, both sides."
    side.guess_labels = [visible(m.tok.readable_pieces([c.token])[0]) for c in side.guess.candidates]
    return side


def both_ways(encoder: Loaded, causal: Loaded, text: str, word: WordChoice | None, layer: int = 0, head: int = 0,
              k: int = 5) -> BothWays:
    """The encoder beside the causal model on `text` at (layer, head), with their guesses for `word`.
    InputError for an empty or too long sentence, or a word that is not in it."""
    text = check_sentence(text)
    if word is None:
        raise InputError("Choose a word of the sentence (Hide word) to compare the two guesses.")
    if text[word.start:word.end] != word.text:
        raise InputError(f"The word {echo(word.text)} is not in the sentence any more: choose a word again.")
    layers, heads = shared_range(encoder.model, causal.model)
    if not 0 <= layer < layers or not 0 <= head < heads:
        raise InputError(f"Both models have layers 0..{layers - 1} and heads 0..{heads - 1}: "
                         f"layer {layer}, head {head} is outside them.")
    return BothWays(text, word, layer, head, _side(encoder, text, word, layer, head, k),
                    _side(causal, text, word, layer, head, k))
