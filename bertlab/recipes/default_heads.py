"""The offline default's MLM + NSP heads: trained by `pretrain` on the MiniLM encoder, its embeddings frozen
and its top N layers re-trained (the recipe: all six), shipped as a small float16 safetensors file (heads,
pooler, the re-trained layers) that `bertlab.load()` merges into the model. The file's metadata keeps the
chain of runs behind it.

    bertlab train-default-heads            # recipe: bertlab/recipes/default_heads.json
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from bertlab.analysis.mask import fill_mask
from bertlab.default_heads_file import default_family, heads_path, retrained_layers  # noqa: F401 (re-exported)
from bertlab.families.bert import Bert
from bertlab.training.corpora import load_corpus
from bertlab.training.loop import TrainEvent
from bertlab.training.pretrain import PretrainConfig, evaluate_mlm, evaluate_nsp, pretrain, trainable_prefixes

log = logging.getLogger(__name__)

# The seeds' sentences, filled in by every evaluation (their top 5 go into the figures and docs/models.md).
# {mask} is spelled by the model's tokenizer.
FILL_IN_SENTENCES = ("the man went to the {mask} store.", "he bought a gallon {mask} milk.", "my dog is {mask}.")
# Short everyday pairs, the kind a student types into the Next-sentence tab (the training text is Wikipedia):
# (A, B, B really follows A). Every evaluation reports P(IsNext) for each.
EVERYDAY_PAIRS = (
    ("The man went to the store.", "He bought a gallon of milk.", True),
    ("She opened the door.", "The room was dark and cold.", True),
    ("I was hungry.", "So I made a sandwich.", True),
    ("It started to rain.", "We ran inside to stay dry.", True),
    ("Tom lost his keys.", "He searched the whole house for them.", True),
    ("The baby was crying.", "Her mother picked her up.", True),
    ("The man went to the store.", "Penguins are flightless birds.", False),
    ("She opened the door.", "The stock market fell sharply.", False),
    ("My sister plays the violin.", "Volcanoes erupt when magma rises.", False),
    ("The train was late.", "The capital of Peru is Lima.", False),
    ("Tom lost his keys.", "The treaty was signed in 1648.", False),
    ("The baby was crying.", "Photosynthesis needs sunlight.", False),
)


PACKAGE = Path(__file__).resolve().parents[1]
HEAD_PREFIXES = default_family().head_prefixes + (default_family().pooler_prefix,)  # the heads file holds
# the pre-training heads and the pooler (which feeds the NSP head)


def recipe_path() -> Path:
    return PACKAGE / "recipes" / "default_heads.json"


def read_recipe(path: str | Path | None = None, **overrides: Any) -> PretrainConfig:
    d = json.loads(Path(path or recipe_path()).read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d.update({k: v for k, v in overrides.items() if v is not None})
    return PretrainConfig(**d)


def head_state(model: Bert, prefixes: tuple[str, ...] = HEAD_PREFIXES,
               dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The weights under `prefixes` (heads, pooler, any re-trained layers), without the tied decoder;
    floating-point ones cast to `dtype` when given."""
    def cast(v: torch.Tensor) -> torch.Tensor:
        return v.to(dtype) if dtype is not None and v.is_floating_point() else v

    return {k: cast(v.detach().cpu()).contiguous() for k, v in model.state_dict().items()
            if k.startswith(prefixes) and k != "cls.predictions.decoder.weight"}


def save_heads(model: Bert, path: str | Path, metadata: dict[str, str] | None = None,
               prefixes: tuple[str, ...] = HEAD_PREFIXES, dtype: torch.dtype = torch.float16) -> Path:
    """Write the heads (and whatever else `prefixes` names) atomically (temp file + rename), as `dtype`:
    float16 halves the file (so all six layers fit in 25 MB), and the held-out figures agree with float32's to
    the first decimal; loading casts them back to the model's dtype."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file(head_state(model, prefixes, dtype), tmp, metadata={"format": "pt", **(metadata or {})})
    os.replace(tmp, path)
    return path


def apply_heads(model: Bert, path: str | Path) -> Bert:
    """A model with the heads in `path` added to `model`'s encoder (strict: every key must fit)."""
    state = load_file(str(path))
    heads = tuple(h for h, key in (("mlm", "cls.predictions.bias"), ("nsp", "cls.seq_relationship.weight"))
                  if key in state)
    new = model.with_heads(heads, task=model.config.task, id2label=model.config.id2label)
    ours = new.state_dict()
    bad = [k for k in state if k not in ours or ours[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"{path} does not fit this encoder: {', '.join(bad[:5])}")
    ours.update(state)
    new.load_state_dict(ours)
    new.tie_weights()
    return new.eval()


def heads_out(out: str | Path | None, init_heads: str | Path | None = None) -> Path:
    """Where `train_default_heads` writes: `out`, or the shipped file; never over `init_heads`
    (the new heads are compared with the old before they replace them)."""
    path = Path(out or heads_path())
    if init_heads and path.resolve() == Path(init_heads).resolve():
        raise ValueError("--out must differ from --init-heads (compare the new heads before replacing the old)")
    return path


def start_model(init_heads: str | Path | None = None) -> Bert:
    """The model `train_default_heads` starts from: the bare offline default (fresh heads), or the
    offline default with the heads in `init_heads` (to continue training them)."""
    from bertlab.loading import default_model_folder, load_default, load_model

    folder = default_model_folder()
    return (load_default(folder, heads=init_heads) if init_heads else load_model(folder))[0]


def _metadata(path: str | Path | None) -> dict[str, str]:
    """A heads file's safetensors metadata ({} for no file)."""
    if not path:
        return {}
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def history(init_heads: str | Path | None) -> list[dict[str, Any]]:
    """The runs behind a heads file, oldest first: each `{"steps", "lr", "seed", "train_top_layers",
    "sentence_pair_prob"}` (the last one absent from runs made before it existed).
    A file written before runs kept their history counts as one run (its own recipe and steps)."""
    if not init_heads:
        return []
    meta = _metadata(init_heads)
    if "history" in meta:
        return json.loads(meta["history"])
    return [run_entry(json.loads(meta.get("recipe", "{}")), int(meta.get("steps", 0)))]


def run_entry(recipe: dict[str, Any], steps: int) -> dict[str, Any]:
    entry = {"steps": steps, **{k: recipe.get(k) for k in ("lr", "seed", "train_top_layers")}}
    if "sentence_pair_prob" in recipe:  # recipes older than the setting leave it out
        entry["sentence_pair_prob"] = recipe["sentence_pair_prob"]
    return entry


def describe_history(runs: Sequence[dict[str, Any]]) -> str:
    """The chain of commands that made a heads file, in words (the `_how` line of its figures)."""
    def one(r: dict[str, Any]) -> str:
        text = f"--steps {r['steps']} --seed {r['seed']} --lr {r['lr']:g} --train-top-layers {r['train_top_layers']}"
        return text + (f" --sentence-pair-prob {r['sentence_pair_prob']:g}" if r.get("sentence_pair_prob") else "")

    if not runs:
        return ""
    text = f"bertlab train-default-heads {one(runs[0])}"
    if len(runs) > 1:
        text += (f", then {len(runs) - 1} continuation(s) with bertlab train-default-heads --init-heads "
                 f"<the previous heads> --out NEW: " + ", ".join(one(r) for r in runs[1:]))
    return text + f" ({sum(r['steps'] for r in runs):,} steps in all)".replace(",", " ")


def start_prefixes(init_heads: str | Path | None) -> tuple[str, ...]:
    """The encoder layers a heads file re-trained (`bert.encoder.layer.N.`): a continuation keeps them
    in its file even when it trains fewer."""
    if not init_heads:
        return ()
    with safe_open(str(init_heads), "pt") as f:
        layers = retrained_layers(f.keys())
    return tuple(default_family().layer_prefix(i) for i in layers)


def steps_so_far(init_heads: str | Path | None) -> int:
    """Training steps behind a heads file (its `total_steps`, or `steps` for a file of one run); 0 for none."""
    meta = _metadata(init_heads)
    return int(meta.get("total_steps", meta.get("steps", 0)))


def train_default_heads(
    out: str | Path | None = None,
    recipe: str | Path | None = None,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    init_heads: str | Path | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Train the heads by the recipe, save them to `out`, evaluate, and return the figures.
    `init_heads` (a heads file, e.g. the shipped one) continues from those weights instead of fresh heads."""
    from bertlab.loading import default_model_folder
    from bertlab.tokenizer import Tokenizer

    out = heads_out(out, init_heads)
    cfg = read_recipe(recipe, **overrides)
    base = start_model(init_heads)
    tok = Tokenizer.from_folder(default_model_folder())
    held = load_corpus(cfg.corpus, split="held_out")
    model, tok, result = pretrain(cfg, model=base, tokenizer=tok, callbacks=callbacks,
                                  eval_documents=held[::10] if cfg.eval_every else None)
    result.raise_for_status()
    total = steps_so_far(init_heads) + result.step
    runs = history(init_heads) + [run_entry(cfg.__dict__, result.step)]
    # the layers this run trained, and any the start file had re-trained before it
    prefixes = tuple(dict.fromkeys(trainable_prefixes(model, cfg.train_top_layers) + start_prefixes(init_heads)))
    meta = {"recipe": json.dumps(cfg.__dict__, default=str), "steps": str(result.step),
            "total_steps": str(total), "init_heads": str(init_heads or ""), "history": json.dumps(runs)}
    save_heads(model, out, meta, prefixes)
    shipped = start_model(out)  # the figures are those of the file as written (float16), not of the run's model
    figures = {"_how": describe_history(runs), **evaluate_default_heads(shipped, tok, held)}  # _how first
    figures["steps"], figures["total_steps"], figures["history"] = result.step, total, runs
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def everyday_pairs(model: Bert, tok) -> dict[str, Any]:
    """P(IsNext) for each of EVERYDAY_PAIRS, and the share the NSP head gets right."""
    from bertlab.analysis.nsp import next_sentence

    p = [round(next_sentence(model, tok, a, b).is_next_probability, 3) for a, b, _ in EVERYDAY_PAIRS]
    right = sum((q > 0.5) == real for q, (_, _, real) in zip(p, EVERYDAY_PAIRS))
    return {"accuracy": right / len(p), "p_is_next": {f"{a} / {b}": q for q, (a, b, _) in zip(p, EVERYDAY_PAIRS)}}


def evaluate_default_heads(model: Bert, tok, held_out_wiki=None, max_tokens: int = 60_000) -> dict[str, Any]:
    """MLM top-1/top-5 on WikiText-2 valid (if BERTLAB_DATA has it) and held-out Wikipedia; NSP accuracy on
    held-out Wikipedia pairs (packed as in training, and one sentence + one sentence) and the everyday pairs."""
    held_out_wiki = held_out_wiki if held_out_wiki is not None else load_corpus("wiki-offline", split="held_out")
    figures: dict[str, Any] = {
        "mlm_wiki_held_out": evaluate_mlm(model, tok, held_out_wiki, max_tokens=max_tokens),
        "nsp_wiki_held_out": evaluate_nsp(model, tok, held_out_wiki, max_pairs=2000),
        "nsp_wiki_held_out_sentences": evaluate_nsp(model, tok, held_out_wiki, max_pairs=2000, sentence_pair_prob=1.0),
        "nsp_everyday_pairs": everyday_pairs(model, tok),
    }
    try:
        wt2 = load_corpus("wikitext2", split="held_out")
        figures["mlm_wikitext2_valid"] = evaluate_mlm(model, tok, wt2, max_tokens=max_tokens)
    except Exception as e:  # data folder not configured: say so in the figures
        figures["mlm_wikitext2_valid"] = f"not measured: {e}"
    figures["fill_ins"] = {tok.spell(s): [c.token for c in fill_mask(model, tok, tok.spell(s), k=5)[0].candidates]
                           for s in FILL_IN_SENTENCES}
    return figures
