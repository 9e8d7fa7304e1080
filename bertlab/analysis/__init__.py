"""Pure computations behind the panels: model + tokenizer + text in, dataclasses out."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Collection

from bertlab.inputs import InputError, optional_text, require_text
from bertlab.runtime import input_limit

if TYPE_CHECKING:
    from bertlab.tokenizer import Encoding, Tokenizer


@functools.lru_cache(maxsize=16)
def _typed(token: str) -> re.Pattern[str]:
    """A special token as a student may type it: any case, spaces inside the brackets ("[ mask ]")."""
    if len(token) > 2 and token[0] == "[" and token[-1] == "]":
        return re.compile(r"\[\s*" + re.escape(token[1:-1]) + r"\s*\]", re.IGNORECASE)
    return re.compile(re.escape(token), re.IGNORECASE)


def normalise_masks(text: str, tok: "Tokenizer") -> str:
    """`text` with every mask token typed in any case or spacing ("[mask]", "[ Mask ]") spelled as
    the tokenizer's own mask token, so every panel accepts what the Mask tab accepts."""
    return _typed(tok.mask_token).sub(tok.mask_token, text)


def require_context(enc: "Encoding", hidden: Collection[int], tok: "Tokenizer") -> None:
    """InputError when no word piece of `enc` stays visible once the positions in `hidden` and the
    typed mask tokens are hidden: the model would have nothing to guess from."""
    visible = [p for _, s, e in enc.word_spans() for p in range(s, e)
               if p not in hidden and (enc.ids[p] not in tok.special_ids or enc.ids[p] == tok.unk_token_id)]
    if not visible:
        m = tok.mask_token
        raise InputError(
            f"Every word is hidden (the text is only {m}s), so the model has nothing to guess from: leave some "
            f"words around the {m}, e.g. 'The cat sat on the {m}.'"
        )


def encode_input(model, tok: "Tokenizer", a: str, b: str | None = None, what: str = "text") -> "Encoding":
    """`a` (and `b` as sentence B) checked and encoded as every tab encodes them, cut to what the model
    reads; InputError when `a` is empty."""
    a = require_text(a, what)
    b = optional_text(b, "second sentence (B)")
    return tok.encode(a, b, max_length=input_limit(model, tok))
