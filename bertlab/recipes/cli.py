"""`bertlab train-default-heads`: the offline default's MLM + NSP heads, trained by the recipe."""

from __future__ import annotations

import argparse
import json
import sys

from bertlab import options


def add_recipe_parsers(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("train-default-heads", help="train the offline default's MLM + NSP heads (the recipe)",
                       description="The offline default (MiniLM-L6) ships without the heads that guess a masked word "
                                   "(MLM) and judge a sentence pair (NSP). Train them, with the top encoder layers, "
                                   "by the recipe bertlab ships, and write the heads file the default loads; print "
                                   "what it measured as one JSON line. Every option overrides one recipe "
                                   "setting.")
    h.add_argument("--recipe", default=None, type=options.existing_path,
                   help="recipe JSON (default: bertlab/recipes/default_heads.json)")
    h.add_argument("--out", default=None, help="heads file (default: the one bertlab ships)")
    h.add_argument("--steps", type=options.positive_int, default=None, help="override the recipe's steps")
    h.add_argument("--device", type=options.device, default=None, help="override the device: " + options.DEVICE_HELP)
    h.add_argument("--lr", type=float, default=None, help="override the recipe's peak learning rate")
    h.add_argument("--seed", type=int, default=None, help="override the recipe's seed (data order and masks)")
    h.add_argument("--train-top-layers", type=int, default=None,
                   help="override how many of the encoder's top layers are re-trained (default: the recipe's)")
    h.add_argument("--sentence-pair-prob", type=float, default=None,
                   help="override the share of NSP pairs made of one sentence + one sentence")
    h.add_argument("--corpus", default=None,
                   help="override the recipe's corpus (e.g. a .jsonl file that save_documents wrote from it)")
    h.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"],
                   help="override the recipe's precision (bf16: autocast, on a GPU)")
    h.add_argument("--init-heads", default=None, type=options.existing_path,
                   help="continue from this heads file (e.g. the shipped one) instead of fresh heads")
    h.set_defaults(func=cmd_train_default_heads)


def cmd_train_default_heads(args: argparse.Namespace) -> int:
    from bertlab.recipes.default_heads import heads_out, train_default_heads
    from bertlab.training.loop import TqdmCallback

    try:
        heads_out(args.out, args.init_heads)  # before the model loads: fail at once
    except ValueError as e:
        print(f"bertlab: {e}", file=sys.stderr)
        return 2
    figures = train_default_heads(out=args.out, recipe=args.recipe, callbacks=[TqdmCallback(desc="heads")],
                                  init_heads=args.init_heads, steps=args.steps, device=args.device, lr=args.lr,
                                  seed=args.seed, train_top_layers=args.train_top_layers,
                                  sentence_pair_prob=args.sentence_pair_prob, corpus=args.corpus,
                                  precision=args.precision)
    print(json.dumps(figures))
    return 0
