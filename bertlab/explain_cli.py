"""`bertlab explain`: which input tokens one prediction rests on, as one JSON line.

    bertlab explain --text "The man went to the [MASK] store." [--target golden]
    bertlab explain --text "The man went to the store." --text-b "He bought milk."       (IsNext)
    bertlab explain --model runs/sst2 --text "a gripping film" [--target positive]       (a class)
    bertlab explain --model runs/ner --text "Angela Merkel visited Paris" --target Paris (its tag)
    bertlab explain --model runs/qa --text "Who went?" --text-b "The man went." --target end

What is explained follows from the model and the text: a fine-tuned model's head (class, entity tag,
answer start/end); else the masked word when the text holds the mask token; else, with --text-b,
the pair head (IsNext). Prints tokens, scores, the target and, for integrated gradients, the
completeness gap; errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from bertlab import options
from bertlab.inputs import InputError


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from bertlab.analysis.attribution import BASELINES, METHODS, QUADRATURES

    p = sub.add_parser(
        "explain", help="attribution of one prediction to the input tokens (one JSON line)",
        description="Integrated gradients or gradient × input of one prediction's probability, per input "
                    "token: a masked word, IsNext, a fine-tuned model's class, an entity tag, an answer's "
                    "start or end.")
    p.add_argument("--model", metavar="SOURCE", default=None, type=options.model_source,
                   help="a folder or a Hugging Face name (default: the offline MiniLM)")
    p.add_argument("--text", required=True, help="the text (with the mask token for a masked word; the question "
                                                 "for a QA model)")
    p.add_argument("--text-b", default=None, help="sentence B (pair head, sentence-pair classifier) or the paragraph "
                                                  "(QA)")
    p.add_argument("--method", choices=METHODS, default="ig", help="ig (integrated gradients, default) or "
                                                                   "grad-x-input")
    p.add_argument("--target", default=None,
                   help="what to explain: the word at the mask (default the top guess), a label name or id "
                        "(pair head, classifier; default the predicted one), a word of the text (entity tag; "
                        "default the first entity), start or end (QA; default start)")
    p.add_argument("--steps", type=_steps, default=None,
                   help="integrated gradients' path points (default: 16, tripled until the completeness gap is "
                        "under 1%%)")
    p.add_argument("--baseline", choices=BASELINES, default="pad",
                   help="what each word becomes at the path's start: the pad token's embedding (default), the "
                        "mask token's, or zeros")
    p.add_argument("--quadrature", choices=QUADRATURES, default="riemann", help="riemann (midpoint, default) or "
                                                                                 "gausslegendre")
    p.set_defaults(func=run)
    return p


def _steps(text: str) -> int:
    from bertlab.analysis.attribution import MAX_STEPS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if not 1 <= value <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"{value} is outside 1..{MAX_STEPS}")
    return value


def pick_target(model, tok, text: str, text_b: str | None, target: str | None):
    """(input, target) for what `model` can explain about `text` (see the module's docstring)."""
    from bertlab.analysis import normalise_masks
    from bertlab.analysis.targets import class_target, mask_target, pair_target, span_target, tag_target

    task = model.config.task
    if task == "sequence_classification":
        return class_target(model, tok, text, text_b, label=target)
    if task == "token_classification":
        return tag_target(model, tok, text, word=target)
    if task == "question_answering":
        if not text_b or not text_b.strip():
            raise InputError("A QA model needs the paragraph: give it with --text-b (the question is --text).")
        where = (target or "start").strip().lower()
        if where not in ("start", "end"):
            raise InputError(f"--target for a QA model is start or end, not {target[:40]!r}.")
        return span_target(model, tok, text, text_b, end=where == "end")
    if tok.mask_token in normalise_masks(text, tok):
        return mask_target(model, tok, text, word=target)
    if text_b is not None and text_b.strip():
        names = {"isnext": 0, "notnext": 1, "0": 0, "1": 1}
        label = names.get((target or "0").strip().lower())
        if label is None:
            raise InputError(f"--target for the pair head is IsNext or NotNext (0 or 1), not {target[:40]!r}.")
        return pair_target(model, tok, text, text_b, label=label)
    raise InputError(f"Nothing to explain: put {tok.mask_token} in --text (a masked word), give --text-b (does B "
                     "follow?), or load a fine-tuned model with --model.")


def run(args: argparse.Namespace) -> int:
    from bertlab.analysis.attribution import attribute
    from bertlab.loading import load
    from bertlab.runtime import cap_threads

    cap_threads()
    model, tok = load(args.model)
    ex, target = pick_target(model, tok, args.text, args.text_b, args.target)
    result = attribute(model, tok, ex, target, method=args.method, steps=args.steps, baseline=args.baseline,
                       rule=args.quadrature)
    print(json.dumps(result.as_json(), ensure_ascii=False))
    sys.stdout.flush()
    return 0
