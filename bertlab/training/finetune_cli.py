"""`bertlab finetune` and `bertlab evaluate`: fine-tune a model on a task, score a fine-tuned model.

    bertlab finetune --task sst2 --out runs/sst2 --max-train-examples 8000 --epochs 2
    bertlab evaluate --task sst2 --model runs/sst2 --data ../shared/data/sst2/dev.tsv
    bertlab evaluate --task nli --model runs/nli --data SICK.txt --split test
    bertlab evaluate --task sts --model runs/sts --data ../shared/data/sick/SICK_train_trial.txt

Both print one JSON line on stdout (progress and logs go to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from bertlab import options

log = logging.getLogger(__name__)

EXIT_FAILED = 1


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message is for the user (no traceback): bad data, model, or settings."""
    from bertlab.settings import DataNotFoundError
    from bertlab.tasks import DataFormatError, DataSourceError, FeatureError
    from bertlab.tasks.metrics import MetricError
    from bertlab.training.checkpoint import TrainingStateError
    from bertlab.training.finetune import FinetuneError
    from bertlab.weights import CheckpointError

    return (CheckpointError, DataNotFoundError, DataFormatError, DataSourceError, FeatureError, FinetuneError,
            MetricError, TrainingStateError, KeyError, ValueError)


def _fail(command: str, error: BaseException | str) -> int:
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    print(f"bertlab {command}: {text}", file=sys.stderr)
    return EXIT_FAILED


# -- finetune --------------------------------------------------------------------------------
def add_finetune_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`bertlab finetune`: options mirror FinetuneConfig."""
    from bertlab.tasks import TASKS
    from bertlab.tasks.layer_features import FEATURES
    from bertlab.training.finetune import MODES, FinetuneConfig
    from bertlab.training.finetune_defaults import FEATURE_HEAD_RECIPES, RECIPES
    from bertlab.training.loop import PRECISIONS

    d, head = FinetuneConfig(), FEATURE_HEAD_RECIPES["ner"]
    full = "; ".join(f"{t}: {r.epochs} epochs, lr {r.lr:g}, batch {r.batch_size}, length {r.max_length}, "
                     f"from {r.start_name}" for (t, m), r in RECIPES.items() if m == "full")
    p = sub.add_parser(
        "finetune", help="fine-tune a model on sst2, nli, sts, ner or qa",
        description="Put a task head on an encoder, fine-tune it (full, frozen-encoder 'feature', or adapters), "
                    "score it on the dev split, and save it (Hugging Face layout) to --out. Data without a dev "
                    "part of its own (one SST-2 or CoNLL file, a folder without a dev file, a SICK file without "
                    "a TRIAL part, one SQuAD article) gives up a seeded 10% of its examples as dev, never "
                    "trained on: the log and the results JSON (\"dev_held_out\": true) say so. Give "
                    "--eval-data to score on a dev file of your own instead. Settings not given take the task's "
                    f"measured defaults (full mode: {full}; feature and adapter modes: lr 1e-3).",
    )
    p.add_argument("--task", required=True, choices=list(TASKS), help="the task: " + ", ".join(TASKS))
    p.add_argument("--data", default=None, type=options.existing_path,
                   help="the task's data: a folder or file in its format (default: BERTLAB_DATA's copy)")
    p.add_argument("--eval-data", default=None, type=options.existing_path,
                   help="a separate dev file or folder (default: --data's dev part; when it has none, a seeded "
                        "10%% of --data held out)")
    p.add_argument("--model", default=None, type=options.model_source,
                   help="a folder or hub name; 'default' = the offline default, 'default-encoder' = its encoder as "
                        "the package ships it (default: the task's start, see above)")
    p.add_argument("--out", required=True, type=options.path_text,
                   help="output folder: the fine-tuned model, results, checkpoints/")
    p.add_argument("--mode", default=d.mode, choices=list(MODES),
                   help="full: all weights; feature: frozen encoder, head only; adapter: Houlsby adapters "
                        "(default %(default)s)")
    p.add_argument("--features", default=None, choices=list(FEATURES),
                   help="with --mode feature, task ner: the BERT paper's feature-based NER (its Table 7). Each "
                        "word's vectors (first piece) at every stage of the frozen encoder are computed once and "
                        "cached; a linear head (the paper: a two-layer BiLSTM) learns on: embeddings (stage 0), "
                        "last, second-to-last, sum-last-4 (sum of the last four layers), concat-last-4 (the four "
                        "side by side) or mix (a softmax-weighted sum of all stages and a scale, learned with the "
                        "head; the JSON gives its weights). Unless given: lr "
                        f"{head.lr:g}, {head.epochs} epochs (chosen on train data alone by bench/feature_table.py). "
                        "Default: the model's own head on the last layer, trained through the frozen encoder")
    p.add_argument("--adapter-size", type=options.positive_int, default=d.adapter_size,
                   help="adapter bottleneck (default %(default)s)")
    p.add_argument("--epochs", type=options.positive_int, default=None,
                   help="passes over the training set (default: the task's, see above)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the task's and mode's)")
    p.add_argument("--batch-size", type=options.positive_int, default=None,
                   help="examples per step (default: the task's)")
    p.add_argument("--max-length", type=options.positive_int, default=None,
                   help="tokens per example (QA: per window); default: the task's")
    p.add_argument("--warmup-ratio", type=float, default=None, help="share of the steps warming the lr up")
    p.add_argument("--max-train-examples", type=int, default=None, help="a seeded random subset of the training set")
    p.add_argument("--max-eval-examples", type=int, default=None, help="a seeded random subset of the dev set")
    p.add_argument("--doc-stride", type=int, default=None, help="QA: tokens shared by consecutive windows")
    p.add_argument("--label-all-pieces", action="store_true",
                   help="NER: label every WordPiece of a word (B-X -> I-X), not the first only")
    p.add_argument("--eval-every", type=int, default=None, help="steps between dev evaluations (default: each epoch)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between two checkpoints in OUT/checkpoints (default 0: none)")
    p.add_argument("--resume", default=None, type=options.existing_path,
                   help="a checkpoint folder of an earlier run to go on from")
    p.add_argument("--overwrite", action="store_true", help="delete checkpoints an earlier run left in OUT")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the head's initial weights, the data order and dropout (default %(default)s)")
    p.add_argument("--device", type=options.device, default="auto", help=options.DEVICE_HELP)
    p.add_argument("--precision", default="auto", choices=list(PRECISIONS),
                   help="auto (default): bf16 autocast where the device has native bf16 (recent CPUs, GPUs), else fp32")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_finetune)
    return p


def config_from_args(args: argparse.Namespace) -> Any:
    from bertlab.training.finetune import FinetuneConfig

    return FinetuneConfig(
        task=args.task, data=args.data, eval_data=args.eval_data, model=args.model, mode=args.mode,
        features=getattr(args, "features", None), adapter_size=args.adapter_size, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size,
        max_length=args.max_length, max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples, doc_stride=args.doc_stride, label_all_pieces=args.label_all_pieces,
        warmup_ratio=getattr(args, "warmup_ratio", None),
        seed=args.seed, out_dir=args.out, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        overwrite=args.overwrite, device=args.device, precision=getattr(args, "precision", "auto"),
    )


def cmd_finetune(args: argparse.Namespace) -> int:
    from bertlab.training.feature_head import run_finetune
    from bertlab.training.loop import TqdmCallback
    from bertlab.training.queue import queued

    try:
        cfg = config_from_args(args)
        callbacks = [] if args.no_progress else [TqdmCallback(desc=f"fine-tuning {args.task}", file=sys.stderr)]
        with queued(f"bertlab finetune {args.task}"):  # the class queue, when BERTLAB_QUEUE is set
            result = run_finetune(cfg, callbacks=callbacks, resume_from=args.resume)
    except _user_errors() as e:
        return _fail("finetune", e)
    print(json.dumps({"task": args.task, **result.summary()}, default=str))
    if not result.train.ok:
        return _fail("finetune", result.error or "training failed")
    return 0


# -- evaluate --------------------------------------------------------------------------------
def add_evaluate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`bertlab evaluate`: the task metric of a fine-tuned model, as one JSON line."""
    from bertlab.tasks import TASKS

    p = sub.add_parser(
        "evaluate", help="score a fine-tuned model on a task's data (one JSON line)",
        description="Run a fine-tuned model over a data file and print the task's metric (accuracy, entity F1, "
                    "SQuAD exact match and F1, or for sts Pearson, Spearman and the mean squared error) as one "
                    "JSON line.",
    )
    p.add_argument("--task", required=True, choices=list(TASKS), help="the task: " + ", ".join(TASKS))
    p.add_argument("--model", required=True, type=options.model_source,
                   help="the fine-tuned model's folder (or hub name)")
    p.add_argument("--data", default=None, type=options.existing_path,
                   help="a data file or folder in the task's format (default: BERTLAB_DATA's)")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test", "all"],
                   help="which part of --data: SICK's TRAIN, TRIAL (dev) or TEST part; SQuAD's article split "
                        "(train/dev); a folder's train/dev/test file (SST-2, CoNLL). 'all' scores every example "
                        "(a whole SQuAD or SICK file, every file of a folder); a single SST-2 or CoNLL file is "
                        "always read whole (default %(default)s)")
    p.add_argument("--max-examples", type=options.positive_int, default=None, help="score only the first N examples")
    p.add_argument("--max-length", type=options.positive_int, default=None,
                   help="tokens per example (QA: per window); default: the task's, within the model's limit")
    p.add_argument("--doc-stride", type=options.positive_int, default=None,
                   help="QA: tokens shared by consecutive windows (default: the task's)")
    p.add_argument("--batch-size", type=options.positive_int, default=64,
                   help="examples per batch (default %(default)s)")
    p.add_argument("--device", type=options.device, default="auto", help=options.DEVICE_HELP)
    p.set_defaults(func=cmd_evaluate)
    return p


def cmd_evaluate(args: argparse.Namespace) -> int:
    from bertlab.loading import load
    from bertlab.runtime import resolve_device
    from bertlab.tasks import get_task
    from bertlab.training.finetune import evaluate

    try:
        task = get_task(args.task)
        examples = task.read(args.split, path=args.data)
        if not examples:
            raise ValueError(f"no {task.name} examples in the {args.split} part of {args.data or 'BERTLAB_DATA'}: "
                             f"choose another --split (train, dev, test or all).")
        if args.max_examples is not None:
            examples = examples[: args.max_examples]
        model, tok = load(args.model)
        model.to(resolve_device(args.device))
        scores = evaluate(model, tok, task, examples, max_length=args.max_length, batch_size=args.batch_size,
                          doc_stride=args.doc_stride)
    except _user_errors() as e:
        return _fail("evaluate", e)
    print(json.dumps({"task": task.name, "model": args.model, "data": args.data, "split": args.split,
                      "main_metric": task.main_metric, **scores}))
    return 0
