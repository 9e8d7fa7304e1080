"""What each tab explains: one input as the model reads it and one probability of its head, from text.

    mask_target(model, tok, "The man went to the [MASK] store.")   a masked word (default: the top guess)
    pair_target(model, tok, a, b)                                    IsNext (ALBERT: A before B)
    class_target(model, tok, a, b=None, label=None)                  a fine-tuned classifier's class
    tag_target(model, tok, text, word=None)                          an entity tag (token classification)
    span_target(model, tok, question, paragraph, end=False)          a QA answer's start or end

Each returns (ExplainInput, Target) for `bertlab.analysis.attribution.attribute`.
"""

from __future__ import annotations

import torch

from bertlab.analysis import encode_input, normalise_masks
from bertlab.analysis.ablation import target_piece_id
from bertlab.analysis.attribution import ExplainInput, Target, head_kwargs
from bertlab.analysis.predict import require_head, split_words
from bertlab.inputs import InputError, require_text
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tasks import encode_words
from bertlab.tokenizer import Encoding, Tokenizer


def explain_input(model: torch.nn.Module, tok: Tokenizer, a: str, b: str | None = None) -> ExplainInput:
    """`a` (and `b`) encoded as the tabs encode them, cut to what the model reads, as attribution reads it."""
    enc = encode_input(model, tok, a, b)
    return _from_ids(model, tok, enc.ids, enc.type_ids, enc.tokens, enc, enc.warning)


def _from_ids(model, tok: Tokenizer, ids: list[int], type_ids: list[int], tokens: list[str],
              enc: Encoding | None = None, warning: str | None = None) -> ExplainInput:
    specials = model.family.special_tokens(tok)
    kept = {specials[role][1] for role in ("cls", "sep", "pad", "mask")}
    device = model_device(model)
    b_start = None
    if enc is not None and 1 in enc.sequence_ids:
        b_start = enc.sequence_ids.index(1)
    return ExplainInput(torch.tensor([ids], device=device), torch.tensor([type_ids], device=device), list(tokens),
                        [i in kept for i in ids], b_start, warning)


def _ordinary_best(tok: Tokenizer, probs: torch.Tensor) -> int:
    """The most probable ordinary piece of a [vocab] row (never a special token or placeholder)."""
    probs = probs.clone()
    bad = [i for i in tok.placeholder_ids if i < probs.shape[0]]
    probs[bad] = -1.0
    return int(probs.argmax())


def mask_target(model: torch.nn.Module, tok: Tokenizer, text: str, word: str | None = None,
                which: int = 0) -> tuple[ExplainInput, Target]:
    """The probability of `word` (default: the model's top guess) at the `which`-th mask token of `text`."""
    model.require("mlm")
    text = normalise_masks(require_text(text), tok)
    ex = explain_input(model, tok, text)
    masks = [i for i, t in enumerate(ex.input_ids[0].tolist()) if t == tok.mask_token_id]
    if not masks:
        raise InputError(f"The text has no {tok.mask_token}: write {tok.mask_token} where the word to explain goes, "
                         f"e.g. 'The capital of France is {tok.mask_token}.'")
    if not 0 <= which < len(masks):
        raise InputError(f"The text has {len(masks)} {tok.mask_token}(s); there is no number {which + 1}.")
    position = masks[which]
    if word is not None and str(word).strip():
        index = target_piece_id(tok, word)
    else:
        probs = _probabilities(model, ex, Target("mlm", 0, position))
        index = _ordinary_best(tok, probs)
    piece = tok.id_to_token(index)
    return ex, Target("mlm", index, position, f"P({piece!r} at {tok.mask_token}, token {position})")


def pair_target(model: torch.nn.Module, tok: Tokenizer, a: str, b: str, label: int = 0) -> tuple[ExplainInput, Target]:
    """The pair head's probability of `label` (0: IsNext, or ALBERT's "A before B") for sentences a, b."""
    model.require("nsp")
    a = require_text(a, "first sentence (A)")
    b = require_text(b, "second sentence (B)")
    if label not in (0, 1):
        raise InputError(f"the pair head has labels 0 and 1; got {label}.")
    sop = model.family.pair_task == "sop"
    names = ("A before B", "B before A") if sop else ("IsNext", "NotNext")
    return explain_input(model, tok, a, b), Target("pair", label, None, f"P({names[label]})")


def _label_index(model: torch.nn.Module, label: str | int | None, probs: torch.Tensor) -> int:
    id2label = model.config.id2label
    if label is None or (isinstance(label, str) and not label.strip()):
        return int(probs.argmax())
    if isinstance(label, int) or str(label).strip().isdigit():
        index = int(label)
        if index not in id2label:
            raise InputError(f"there is no label {index}: the labels are {_labels(id2label)}.")
        return index
    by_name = {str(v).lower(): k for k, v in id2label.items()}
    if str(label).strip().lower() not in by_name:
        raise InputError(f"{str(label)[:40]!r} is not one of this model's labels ({_labels(id2label)}).")
    return int(by_name[str(label).strip().lower()])


def _labels(id2label: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in list(id2label.items())[:12])


def class_target(model: torch.nn.Module, tok: Tokenizer, a: str, b: str | None = None,
                 label: str | int | None = None) -> tuple[ExplainInput, Target]:
    """A sentence classifier's probability of `label` (a name or id; default the predicted one)."""
    require_head(model, "sequence_classification", "Explaining a class")
    ex = explain_input(model, tok, require_text(a), b if b and str(b).strip() else None)
    probs = _probabilities(model, ex, Target("class", 0))
    index = _label_index(model, label, probs)
    return ex, Target("class", index, None, f"P({model.config.id2label[index]})")


def tag_target(model: torch.nn.Module, tok: Tokenizer, text: str, word: str | int | None = None,
               label: str | int | None = None) -> tuple[ExplainInput, Target]:
    """A token classifier's probability of `label` (default: the predicted tag) at the first piece of
    `word` (its index among the words, or the word itself; default the first word tagged as an entity)."""
    require_head(model, "token_classification", "Explaining an entity tag")
    words = split_words(require_text(text))
    ids, word_ids = encode_words([w for w, _, _ in words], tok, max_length=input_limit(model, tok))
    ex = _from_ids(model, tok, ids, [0] * len(ids), tok.convert_ids_to_tokens(ids))
    firsts = {}
    for i, w in enumerate(word_ids):
        if w is not None and w not in firsts:
            firsts[w] = i
    if not firsts:
        raise InputError("The text has no words the tokenizer can read: type a sentence.")
    probs = _probabilities(model, ex, Target("tag", 0, 0), full=True)  # [seq, labels]
    id2label = model.config.id2label
    if word is None or (isinstance(word, str) and not word.strip()):
        tagged = [w for w, i in firsts.items() if str(id2label[int(probs[i].argmax())]) != "O"]
        w_index = tagged[0] if tagged else min(firsts)
    elif isinstance(word, int) or str(word).strip().isdigit():
        w_index = int(word)
    else:
        found = [i for i, (w, _, _) in enumerate(words) if w.lower() == str(word).strip().lower()]
        if not found:
            raise InputError(f"{str(word)[:40]!r} is not one of the words of the text.")
        w_index = found[0]
    if w_index not in firsts:
        raise InputError(f"word {w_index} is not in what the model read (the text has {len(firsts)} words read).")
    position = firsts[w_index]
    index = _label_index(model, label, probs[position])
    name = f"P({id2label[index]} for {words[w_index][0]!r}, token {position})"
    return ex, Target("tag", index, position, name)


def span_target(model: torch.nn.Module, tok: Tokenizer, question: str, context: str, end: bool = False,
                position: int | None = None) -> tuple[ExplainInput, Target]:
    """A QA model's probability that the answer starts (or, with `end`, ends) at token `position`
    (default: the best start of the context, or the best end from there on within 30 tokens)."""
    require_head(model, "question_answering", "Explaining an answer")
    ex = explain_input(model, tok, require_text(question, "question"), require_text(context, "paragraph"))
    if ex.sentence_b_start is None:
        raise InputError("The paragraph has no words left once the question is read: shorten the question.")
    ctx = [i for i in range(ex.sentence_b_start, len(ex)) if not ex.keep[i]]
    if position is None:
        start = _probabilities(model, ex, Target("start", 0), full=True)
        best_start = max(ctx, key=lambda i: float(start[i]))
        if end:
            stop = _probabilities(model, ex, Target("end", 0), full=True)
            position = max((i for i in ctx if best_start <= i < best_start + 30), key=lambda i: float(stop[i]))
        else:
            position = best_start
    elif position not in ctx:
        raise InputError(f"token {position} is not a token of the paragraph ({ctx[0]}..{ctx[-1]}).")
    kind = "end" if end else "start"
    return ex, Target(kind, int(position), None, f"P(answer {kind}s at {ex.tokens[position]!r}, token {position})")


def _probabilities(model: torch.nn.Module, ex: ExplainInput, target: Target, full: bool = False) -> torch.Tensor:
    """The head's probabilities at the input for `target`'s kind: [classes] (or [seq, labels] with
    `full` for tags, [seq] for start/end)."""
    kwargs = head_kwargs(model, target, 1, ex.input_ids.shape[1], ex.input_ids.device)
    with eval_mode(model), torch.inference_mode():
        out = model(ex.input_ids, token_type_ids=ex.token_type_ids, **kwargs)
    if target.kind == "mlm":
        return out.mlm_logits[0].float().softmax(-1).cpu()
    if target.kind == "pair":
        return out.nsp_logits[0].float().softmax(-1).cpu()
    if target.kind == "class":
        return out.logits[0].float().softmax(-1).cpu()
    if target.kind == "tag":
        probs = out.logits[0].float().softmax(-1).cpu()  # [seq, labels]
        return probs if full else probs[target.position]
    logits = out.start_logits if target.kind == "start" else out.end_logits
    return logits[0].float().softmax(-1).cpu()  # [seq]


def input_from_tokens(model: torch.nn.Module, tok: Tokenizer, tokens: list[str],
                      type_ids: list[int] | None = None) -> ExplainInput:
    """An input given as the tokens the model read (e.g. a Mask-tab prediction's, masks in place)."""
    ids = [tok.token_to_id(t) for t in tokens]
    if any(i is None for i in ids):
        bad = next(t for t, i in zip(tokens, ids) if i is None)
        raise InputError(f"{bad[:40]!r} is not a token of this model's vocabulary.")
    return _from_ids(model, tok, ids, list(type_ids) if type_ids is not None else [0] * len(ids), tokens)


def word_target(tok: Tokenizer, ex: ExplainInput, position: int, token_id: int) -> Target:
    """The MLM target "probability of piece `token_id` at token `position`" of `ex`."""
    return Target("mlm", int(token_id), int(position),
                  f"P({tok.id_to_token(int(token_id))!r} at {ex.tokens[position]}, token {position})")


def explain_choices(kind: str | None, ner_text: str, limit: int = 60) -> list[str]:
    """What "Does attention explain it?" offers for a fine-tuned head (`kind`, as `tasks.models.model_task`
    names it): NER the tag of the first entity or of a word of `ner_text`, QA the answer's start or end
    (the order `tag_target` and `span_target` are asked in); [] for a class (the predicted one)."""
    if kind == "ner":
        words = split_words(ner_text)[:limit] if ner_text.strip() else []
        return ["tag of the first entity"] + [f"tag of word {i}: {w}" for i, (w, _, _) in enumerate(words)]
    if kind == "qa":
        return ["answer start", "answer end"]
    return []

