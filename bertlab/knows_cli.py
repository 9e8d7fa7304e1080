"""`bertlab probe` and `bertlab patch`: what the layers know, as one JSON line each.

    bertlab probe --property pos --train conll2003/train.txt --eval conll2003/dev.txt [--max-train-sentences N]
    bertlab probe --property tree --train ud_ewt/en_ewt-ud-dev.conllu          (one file: split by sentence)
    bertlab patch --clean "Mary gave John a [MASK]." --corrupt "Mary gave Anna a [MASK]." --answer book --wrong pen

A probe's --train/--eval are CoNLL-2003 files (pos, chunk, ner) or CoNLL-U files (upos, deprel, tree); when
--eval is left out or names the --train file, that file is split by sentence (every 5th sentence evaluates).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertlab import options

DEFAULT_MAX_TRAIN = 1000
DEFAULT_MAX_EVAL = 500


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from bertlab.analysis.patching import KINDS
    from bertlab.analysis.probe_data import PROPERTIES
    from bertlab.analysis.probes import POOLS

    p = sub.add_parser("probe", help="probe accuracy per layer for one property (one JSON line)",
                       description="Linear probes on frozen word features at every layer (0 = embeddings), with a "
                                   "control task and a learned scalar mix; 'tree' fits the structural probe.")
    p.add_argument("--property", required=True, choices=PROPERTIES, help="what is probed: " + ", ".join(PROPERTIES))
    p.add_argument("--model", metavar="SOURCE", default=None, type=options.model_source,
                   help="a folder or a hub name (default: the offline one)")
    p.add_argument("--train", required=True, type=lambda t: Path(options.existing_path(t)),
                   help="CoNLL-2003 (pos/chunk/ner) or CoNLL-U file")
    p.add_argument("--eval", type=lambda t: Path(options.existing_path(t)), default=None,
                   help="evaluation file (default: split --train by sentence, every 5th sentence evaluates)")
    p.add_argument("--max-train-sentences", type=_count, default=DEFAULT_MAX_TRAIN,
                   help=f"first N training sentences (default {DEFAULT_MAX_TRAIN})")
    p.add_argument("--max-eval-sentences", type=_count, default=DEFAULT_MAX_EVAL,
                   help=f"first N evaluation sentences (default {DEFAULT_MAX_EVAL})")
    p.add_argument("--control", action="store_true", help="also fit the control task (random label per word type)")
    p.add_argument("--pool", choices=POOLS, default="first", help="a word's feature: its first piece or the mean")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the probes' training and the control task (default %(default)s)")
    p.set_defaults(func=run_probe)

    q = sub.add_parser("patch", help="activation patching of a masked word (one JSON line)",
                       description="Copy activations of the clean run into the corrupted one, one position and "
                                   "layer at a time; recovery = (patched - corrupt) / (clean - corrupt) of the logit "
                                   "difference answer - wrong at the mask.")
    q.add_argument("--clean", required=True, help="the clean sentence, with one mask token")
    q.add_argument("--corrupt", required=True, help="the corrupted sentence: same number of pieces, mask in place")
    q.add_argument("--answer", required=True, help="the word the clean sentence calls for")
    q.add_argument("--wrong", required=True, help="the word the corrupted sentence calls for")
    q.add_argument("--model", metavar="SOURCE", default=None, type=options.model_source,
                   help="a folder or a hub name (default: the offline one)")
    q.add_argument("--kind", choices=KINDS, default="residual", help="what is patched (default: the residual stream)")
    q.set_defaults(func=run_patch)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def probe_sets(prop: str, train: Path, evaluate: Path | None, max_train: int, max_eval: int):
    """(train sentences, eval sentences) for `prop` from the files."""
    from bertlab.analysis.probe_data import read_for, split_sentences

    sentences = read_for(prop, train)
    if evaluate is None or Path(evaluate).expanduser().resolve() == Path(train).expanduser().resolve():
        tr, ev = split_sentences(sentences)
    else:
        tr, ev = sentences, read_for(prop, evaluate)
    return tr[:max_train], ev[:max_eval]


def run_probe(args: argparse.Namespace) -> int:
    from bertlab.analysis.probes import probe_property
    from bertlab.analysis.structural import probe_tree
    from bertlab.loading import load
    from bertlab.runtime import cap_threads

    cap_threads()
    train, evaluate = probe_sets(args.property, args.train, args.eval, args.max_train_sentences,
                                 args.max_eval_sentences)
    model, tok = load(args.model)
    if args.property == "tree":
        out = probe_tree(model, tok, train, evaluate, pool=args.pool, seed=args.seed).as_json()
    else:
        out = probe_property(model, tok, train, evaluate, args.property, control=args.control, pool=args.pool,
                             seed=args.seed).as_json()
    print(json.dumps(out, ensure_ascii=False))
    sys.stdout.flush()
    return 0


def run_patch(args: argparse.Namespace) -> int:
    from bertlab.analysis.patching import patching
    from bertlab.loading import load
    from bertlab.runtime import cap_threads

    cap_threads()
    model, tok = load(args.model)
    grid = patching(model, tok, args.clean, args.corrupt, args.answer, args.wrong, kind=args.kind)
    print(json.dumps(grid.as_json(), ensure_ascii=False))
    sys.stdout.flush()
    return 0
