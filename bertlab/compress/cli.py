"""`bertlab compress quantize|prune|distill`: a smaller model in a folder that `bertlab.load` and
`bertlab evaluate` read, and one JSON line saying what it costs and keeps.

    bertlab compress quantize --model runs/sst2 --out runs/sst2-int8 [--task sst2 --data PATH]
    bertlab compress prune --model runs/sst2 --task sst2 --data PATH --keep 0.5 --out runs/sst2-pruned
    bertlab compress distill --model runs/sst2 --layers 3 --task sst2 --data PATH --out runs/sst2-student

The data options are `bertlab finetune`'s (the same readers, the same held-out dev part).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from bertlab import options

log = logging.getLogger(__name__)

# `bertlab finetune` options that mean the same here (their help and defaults come from there)
DATA_OPTIONS = ("data", "eval_data", "max_train_examples", "max_eval_examples", "max_length", "seed", "device")


def finetune_options(parser: argparse.ArgumentParser, dests: Sequence[str] = DATA_OPTIONS) -> None:
    """Add `bertlab finetune`'s options named by `dests` to `parser`, as finetune declares them
    (one place for their names, help and defaults)."""
    from bertlab.training.finetune_cli import add_finetune_parser

    scratch = argparse.ArgumentParser(add_help=False).add_subparsers()
    finetune = add_finetune_parser(scratch)
    copied = set()
    for action in finetune._actions:
        if action.dest in dests:
            parser._add_action(action)
            copied.add(action.dest)
    if copied != set(dests):  # finetune renamed an option: say which, rather than fail on args.<name> later
        raise RuntimeError(f"bertlab finetune has no option for {sorted(set(dests) - copied)}: update "
                           f"bertlab.compress.cli.DATA_OPTIONS.")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`bertlab compress` and its three methods."""
    from bertlab.tasks import TASKS

    p = sub.add_parser(
        "compress", help="make a model smaller: int8 quantization, head pruning, distillation",
        description="Compress a model into a folder that bertlab.load and `bertlab evaluate` read. Each method "
                    "prints one JSON line: sizes, CPU latency (batch 1 and 32) and, with a task, the score on "
                    "held-out examples of the original and of the result.")
    methods = p.add_subparsers(dest="method", metavar="METHOD", required=True)

    q = methods.add_parser("quantize", help="dynamic int8 of the encoder's Linear layers (embeddings stored int8)",
                           description="Dynamic int8: the encoder's Linear layers run int8 matmuls; the embeddings "
                                       "are stored int8 per row. Give --task to score it against the original.")
    q.add_argument("--model", required=True, type=options.model_source,
                   help="a folder or hub name (a fine-tuned model to score it)")
    q.add_argument("--out", required=True, type=options.path_text, help="output folder")
    q.add_argument("--task", default=None, choices=list(TASKS), help="score original and result on this task")

    pr = methods.add_parser("prune", help="remove the least important attention heads (Michel et al. 2019)",
                            description="Score each head by |d loss / d gate| on training examples, draw the dev "
                                        "score against heads kept, then remove the least important heads for real.")
    pr.add_argument("--model", required=True, type=options.model_source, help="a model fine-tuned for --task")
    pr.add_argument("--task", required=True, choices=list(TASKS), help="the model's task: " + ", ".join(TASKS))
    pr.add_argument("--keep", type=float, default=0.5, help="fraction of the heads kept (default %(default)s)")
    pr.add_argument("--importance-examples", type=int, default=256,
                    help="training examples the head scores average over (default %(default)s)")
    pr.add_argument("--out", required=True, type=options.path_text, help="output folder")

    d = methods.add_parser("distill", help="train a student with fewer layers on a teacher's soft targets",
                           description="A student with --layers layers, started from every other teacher layer, "
                                       "learns T²·KL on the teacher's soft targets plus cross-entropy on the labels "
                                       "(and, with --hidden-weight, the teacher's hidden states).")
    teacher = d.add_mutually_exclusive_group(required=True)
    teacher.add_argument("--model", type=options.model_source, help="the teacher: a model fine-tuned for --task")
    teacher.add_argument("--teacher", dest="model", type=_teacher, help=argparse.SUPPRESS)  # the old name
    d.add_argument("--layers", type=options.positive_int, required=True, help="the student's layers")
    d.add_argument("--task", required=True, choices=list(TASKS), help="the teacher's task: " + ", ".join(TASKS))
    d.add_argument("--out", required=True, type=options.path_text, help="output folder")
    d.add_argument("--temperature", type=float, default=2.0, help="soft-target temperature T (default %(default)s)")
    d.add_argument("--alpha", type=float, default=0.5, help="weight of the soft targets (default %(default)s)")
    d.add_argument("--hidden-weight", type=float, default=0.0,
                   help="weight of the hidden-state MSE (TinyBERT-style; default %(default)s = off)")
    d.add_argument("--epochs", type=int, default=2, help="default %(default)s")
    d.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default %(default)s)")
    d.add_argument("--batch-size", type=int, default=32, help="default %(default)s")
    for parser in (q, pr, d):
        finetune_options(parser)
        parser.add_argument("--reps", type=int, default=5, help="timed passes per batch size (default %(default)s)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.set_defaults(func=cmd_compress)
    return p


def _teacher(text: str) -> str:
    """`distill --teacher`, the old name of --model: still read, with a note."""
    print("bertlab compress distill: --teacher is now --model (the teacher); --teacher will go.", file=sys.stderr)
    return options.model_source(text)


def _errors() -> tuple[type[BaseException], ...]:
    from bertlab.compressed.structure import CompressError
    from bertlab.training.finetune_cli import _user_errors

    return (CompressError, *_user_errors())


def cmd_compress(args: argparse.Namespace) -> int:
    from bertlab.training.finetune_cli import _fail

    command = f"compress {args.method}"
    try:
        summary = run(args)
    except _errors() as e:
        return _fail(command, e)
    print(json.dumps(summary, default=str))
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Do what `args` asks; the JSON summary."""
    from bertlab.compress import lab
    from bertlab.compress.distill import DistillConfig
    from bertlab.compress.measure import MB, disk_bytes, memory_bytes
    from bertlab.loading import load
    from bertlab.training.loop import TqdmCallback

    source = args.model
    model, tok = load(source)  # on the CPU: sizes and latency are the CPU's, and int8 runs there only
    lab.check_method(args.method, model)
    out: dict[str, Any] = {"method": args.method, "model": source, "out": args.out}
    if args.method == "quantize" and args.task is None:
        from bertlab.compress.quantize import quantize

        small = quantize(model)
        lab.save_variant(small, tok, args.out)
        original = getattr(getattr(model, "load_report", None), "folder", None)
        return {**out, "disk_mb": disk_bytes(args.out) / MB, "memory_mb": memory_bytes(small) / MB,
                "original_memory_mb": memory_bytes(model) / MB,
                "original_disk_mb": disk_bytes(original) / MB if original is not None else None}
    data = lab.TaskData.read(args.task, tok, model, data=args.data, eval_data=args.eval_data,
                             max_train=args.max_train_examples, max_dev=args.max_eval_examples, seed=args.seed,
                             max_length=args.max_length)
    before = lab.measure_variant(model, tok, data, "original", "original",
                                 getattr(getattr(model, "load_report", None), "folder", None), args.reps)
    if args.method == "quantize":
        made = lab.run_quantize(model, tok, data, args.out, reps=args.reps)
    elif args.method == "prune":
        def point(p) -> None:
            log.info("%d heads kept: %s %.4f", p.heads_kept, data.task.main_metric, p.score)

        made = lab.run_prune(model, tok, data, args.keep, args.out, reps=args.reps, on_point=point,
                             importance_examples=args.importance_examples)
    else:
        cfg = DistillConfig(task=args.task, layers=args.layers, temperature=args.temperature, alpha=args.alpha,
                            hidden_weight=args.hidden_weight, epochs=args.epochs, lr=args.lr,
                            batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                            device=args.device)
        callbacks = [] if args.no_progress else [TqdmCallback(desc=f"distilling {args.task}", file=sys.stderr)]
        made = lab.run_distill(model, tok, data, cfg, args.out, callbacks=callbacks, reps=args.reps)
    return {**out, "task": data.task.name, "data": data.note, "original": before.as_dict(),
            "result": made.variant.as_dict(),
            "curve": [vars(p) for p in made.curve], **made.summary}


__all__ = ["DATA_OPTIONS", "add_parser", "cmd_compress", "finetune_options", "run"]
