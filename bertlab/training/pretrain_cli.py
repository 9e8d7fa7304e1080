"""`bertlab pretrain` and `bertlab evaluate-mlm`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertlab import options


def add_pretrain_parsers(sub: argparse._SubParsersAction) -> None:
    from bertlab.training.masking import STRATEGIES
    from bertlab.training.objectives import OBJECTIVES
    from bertlab.training.pretrain import PAIR_TASKS, SIZES, PretrainConfig

    d = PretrainConfig()
    p = sub.add_parser("pretrain",
                       help="pre-train a mini BERT, or another family member with its own objective, on a corpus",
                       description="Pre-train a small BERT from scratch, or continue an existing model, with "
                                   "masked-language modelling and next-sentence (or sentence-order) prediction, or "
                                   "with another family member's objective (--objective).")
    p.add_argument("--corpus", default=d.corpus,
                   help="wiki-offline, gensim-wiki, ovos-wiki, a text file or folder, or hf:NAME (default %(default)s)")
    p.add_argument("--size", default=d.size, choices=list(SIZES),
                   help="model size for a new model (default %(default)s)")
    p.add_argument("--model", default=None, type=options.model_source,
                   help="continue this model (folder or hub name) instead of a new one")
    p.add_argument("--steps", type=options.positive_int, default=d.steps, help="optimizer steps (default %(default)s)")
    p.add_argument("--batch-size", type=options.positive_int, default=d.batch_size,
                   help="sequences per step (default %(default)s)")
    p.add_argument("--seq-len", type=options.positive_int, default=d.seq_len,
                   help="tokens per sequence (default %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default %(default)s)")
    p.add_argument("--objective", default=None, choices=list(OBJECTIVES),
                   help="the family member's pre-training objective: "
                        + "; ".join(f"{name} ({o.title.split(': ', 1)[-1]})" for name, o in OBJECTIVES.items())
                        .replace("%", "%%") + ". Default: bert, with --masking and --pair-task free to change")
    p.add_argument("--embedding-size", type=int, default=None,
                   help="albert/electra: factorised embedding width (default: the objective's)")
    p.add_argument("--shared-layers", action=argparse.BooleanOptionalAction, default=None,
                   help="albert: one layer shared across depth (default: shared)")
    p.add_argument("--masking", default=None, choices=list(STRATEGIES),
                   help=f"without --objective: which tokens to mask (default {d.masking}); entity and phrase "
                        "hide whole named entities / noun phrases and need tagged text (--corpus conll2003)")
    p.add_argument("--pair-task", default=None, choices=list(PAIR_TASKS),
                   help=f"without --objective: the sentence-pair task (default {d.pair_task})")
    p.add_argument("--max-documents", type=int, default=None, help="use only the first N documents")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between two checkpoints in OUT/checkpoints (default 0: none)")
    p.add_argument("--resume", default=None, type=options.existing_path,
                   help="a checkpoint folder of an earlier run to go on from")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the initial weights, the data order and the masks (default %(default)s)")
    p.add_argument("--device", type=options.device, default="auto", help=options.DEVICE_HELP)
    p.add_argument("--precision", default=d.precision, choices=["auto", "bf16", "fp32"],
                   help="auto (default): bf16 autocast where the device has native bf16 (recent CPUs, GPUs), else fp32")
    p.add_argument("--out", required=True, type=options.path_text,
                   help="output folder: checkpoints, and the final model in OUT/final (written only when the run "
                        "completes)")
    p.set_defaults(func=cmd_pretrain)

    e = sub.add_parser("evaluate-mlm", help="masked-token top-1/top-5 accuracy of a model on a text file",
                       description="Choose 15% of the tokens with a fixed seed, replace them by the mask token and "
                                   "print the model's top-1 and top-5 accuracy as one JSON line.")
    e.add_argument("--model", default=None, type=options.model_source,
                   help="folder or hub name (default: the offline default)")
    e.add_argument("--text", required=True, type=options.existing_path,
                   help="a plain-text file (blank lines between documents)")
    e.add_argument("--seed", type=int, default=0, help="seed of the tokens chosen for masking (default %(default)s)")
    e.add_argument("--seq-len", type=options.positive_int, default=128,
                   help="tokens per sequence the text is cut into (default %(default)s)")
    e.add_argument("--max-tokens", type=options.positive_int, default=None,
                   help="read only the first N tokens of the text (default: all)")
    e.set_defaults(func=cmd_evaluate_mlm)


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Pre-train; only a completed run writes OUT/final (atomically). Errors reach `bertlab.cli.main`,
    which prints them as one line."""
    from bertlab.loading import load
    from bertlab.training.checkpoint import save_model_atomically
    from bertlab.training.corpora import load_corpus
    from bertlab.training.loop import TqdmCallback
    from bertlab.training.objectives import DEFAULT_OBJECTIVE, get_objective
    from bertlab.training.pretrain import PretrainConfig, check_continuable, pretrain, pretrain_objective
    from bertlab.training.queue import queued

    out = Path(args.out)
    _check_options(args)
    d = PretrainConfig()
    cfg = PretrainConfig(
        size=args.size, corpus=args.corpus, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
        lr=args.lr, masking=args.masking or d.masking, pair_task=args.pair_task or d.pair_task,
        objective=args.objective, embedding_size=args.embedding_size, shared_layers=args.shared_layers,
        max_documents=args.max_documents, out_dir=str(out / "checkpoints"), checkpoint_every=args.checkpoint_every,
        seed=args.seed, device=args.device, precision=args.precision,
    )
    if args.resume and not Path(args.resume).is_dir():
        raise FileNotFoundError(f"--resume {args.resume[:80]}: no such checkpoint folder (give one of "
                                f"OUT/checkpoints/checkpoint-N of an earlier run).")
    model = tok = None
    if args.model:
        model, tok = load(args.model)
        if args.objective is not None:  # before the corpus loads: fail at once
            check_continuable(get_objective(args.objective), model)
    held = load_corpus(args.corpus, split="held_out") if not Path(args.corpus).exists() else None
    progress = [TqdmCallback(desc=f"pre-training ({args.objective or DEFAULT_OBJECTIVE})")]
    with queued(f"bertlab pretrain {args.size}"):  # the class queue, when BERTLAB_QUEUE is set
        if args.objective is None:
            model, tok, result = pretrain(cfg, model=model, tokenizer=tok, callbacks=progress,
                                          eval_documents=held[:50] if held else None, resume_from=args.resume)
        else:
            run = pretrain_objective(cfg, model=model, tokenizer=tok, callbacks=progress,
                                     eval_documents=held[:50] if held else None, resume_from=args.resume)
            result = run.result
    if result.status != "completed":
        final = None
    elif args.objective is None:
        final = save_model_atomically(model, tok, out / "final")
    else:
        final = run.save(out / "final")
    last = result.last_checkpoint
    print(json.dumps({"status": result.status, "step": result.step, "model": str(final) if final else None,
                      "last_checkpoint": str(last) if last else None, **result.eval_metrics}))
    if not result.ok:
        print(f"bertlab pretrain: {result.error}", file=sys.stderr)
        return 1
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """Options that only the default (BERT-style) run takes: refused, in one line, with an objective; entity /
    phrase masking of a named corpus that has no tags, refused before it loads."""
    from bertlab.training.corpora import NAMED_SOURCES
    from bertlab.training.masking import TAGGED_STRATEGIES, tagged_text_needed

    if args.masking in TAGGED_STRATEGIES and args.corpus in NAMED_SOURCES and args.corpus != "conll2003":
        raise ValueError(tagged_text_needed(args.masking, args.corpus))
    if args.objective is None:
        return
    given = [flag for flag, value in (("--masking", args.masking), ("--pair-task", args.pair_task)) if value]
    if given:
        raise ValueError(f"{' and '.join(given)} cannot be combined with --objective {args.objective}: each objective "
                         f"fixes its masking and pair task. Leave out --objective to choose them yourself.")


def cmd_evaluate_mlm(args: argparse.Namespace) -> int:
    from bertlab.loading import load
    from bertlab.training.corpora import load_text
    from bertlab.training.pretrain import evaluate_mlm

    model, tok = load(args.model)
    docs = load_text(args.text)
    figures = evaluate_mlm(model, tok, docs, seed=args.seed, seq_len=args.seq_len, max_tokens=args.max_tokens)
    print(json.dumps({"model": args.model or "default", "text": args.text, **figures}))
    return 0
