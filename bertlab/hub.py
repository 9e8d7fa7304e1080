"""Hugging Face hub models for a classroom: the recommended list, what a model's download weighs,
and downloading only the files bertlab reads into the hub cache (with byte progress), so that
`bertlab.load(name)` later works offline. Honours HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE."""

from __future__ import annotations

import fnmatch
import inspect
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bertlab.settings import hub_repo_dir

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


@dataclass(frozen=True)
class HubModel:
    name: str
    about: str


RECOMMENDED: tuple[HubModel, ...] = (
    HubModel("bert-base-uncased", "BERT base: MLM + NSP, the original"),
    HubModel("google/bert_uncased_L-2_H-128_A-2", "BERT miniature: 2 layers, 128 wide (tiny, fast)"),
    HubModel("google/bert_uncased_L-4_H-256_A-4", "BERT miniature: 4 layers, 256 wide"),
    HubModel("google/bert_uncased_L-4_H-512_A-8", "BERT miniature: 4 layers, 512 wide"),
    HubModel("google/bert_uncased_L-8_H-512_A-8", "BERT miniature: 8 layers, 512 wide"),
    HubModel("SpanBERT/spanbert-base-cased", "SpanBERT: BERT trained to fill whole spans"),
    HubModel("roberta-base", "RoBERTa base: MLM only, byte-level BPE, <mask>"),
    HubModel("albert-base-v2", "ALBERT base: one shared layer, MLM + sentence order (SOP)"),
    HubModel("distilbert-base-uncased", "DistilBERT: 6 layers, no segments, no NSP"),
    HubModel("google/electra-small-discriminator", "ELECTRA discriminator: spots replaced tokens"),
    HubModel("google/electra-small-generator", "ELECTRA generator: a small MLM"),
    HubModel("answerdotai/ModernBERT-base", "ModernBERT base (2024): rotary positions, local/global attention, GeGLU"),
    HubModel("jhu-clsp/ettin-encoder-17m", "Ettin encoder 17M: a laptop-sized ModernBERT"),
    HubModel("microsoft/deberta-v3-small", "DeBERTa-v3 small: 6 layers, disentangled attention, relative "
             "positions only; for fine-tuning (its MLM head is untrained)"),
    HubModel("microsoft/deberta-v3-base", "DeBERTa-v3 base: 12 layers, disentangled attention, relative "
             "positions only; for fine-tuning (its MLM head is untrained)"),
)

CONFIG_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spm.model", "tokenizer_config.json", "special_tokens_map.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


class HubError(ValueError):
    """A hub model that cannot be listed or downloaded; the message says what to do."""


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int  # bytes (0 when the hub did not say)


def needed_files(files: list[HubFile]) -> list[HubFile]:
    """The files bertlab reads, from a repository's listing: config, tokenizer, and one set of
    weights (safetensors, sharded or not, else pytorch_model.bin). Never TF/Flax/ONNX files."""
    by_name = {f.name: f for f in files}
    wanted = [by_name[n] for n in (*CONFIG_FILES, *TOKENIZER_FILES) if n in by_name]
    if "tokenizer.json" in by_name:  # vocab.txt and spm.model are only read without tokenizer.json
        wanted = [f for f in wanted if f.name not in ("vocab.txt", "spm.model")]
    if "model.safetensors" in by_name:
        weights = [by_name["model.safetensors"]]
    elif "model.safetensors.index.json" in by_name:
        weights = [f for f in files if f.name == "model.safetensors.index.json"
                   or fnmatch.fnmatch(f.name, "model-*-of-*.safetensors")]
    elif "pytorch_model.bin" in by_name:
        weights = [by_name["pytorch_model.bin"]]
    else:
        weights = []
    return wanted + weights


def check_name(repo_id: str) -> str:
    """`repo_id` stripped, or a HubError when it cannot be a hub model name."""
    name = repo_id.strip()
    if not _HUB_ID.fullmatch(name) or ".." in name:
        raise HubError(f"{name[:80]!r} is not a hub model name "
                       "(like bert-base-uncased or google/electra-small-generator).")
    return name


def remote_files(repo_id: str, revision: str | None = None) -> list[HubFile]:
    """The files bertlab would download for `repo_id`, with their sizes (asks the hub)."""
    from huggingface_hub import HfApi

    name = check_name(repo_id)
    with _hub_errors(name):
        info = HfApi().model_info(name, revision=revision, files_metadata=True)
    files = needed_files([HubFile(s.rfilename, int(s.size or 0)) for s in info.siblings or []])
    _check_usable(name, files)
    return files


def download(repo_id: str, revision: str | None = None, progress: Progress | None = None,
             files: list[HubFile] | None = None) -> Path:
    """Download what bertlab needs of `repo_id` into the hub cache; the snapshot folder.
    `progress(done, total)` is called as bytes arrive (from this thread); `files`: the listing
    `remote_files` gave, when the caller already has it."""
    from huggingface_hub import hf_hub_download

    name = check_name(repo_id)
    files = remote_files(name, revision) if files is None else files
    total, done = sum(f.size for f in files), 0
    bar = _progress_class(lambda n: progress(min(done + n, total), total)) if progress else None
    # Byte progress within a file needs huggingface_hub's `tqdm_class` (newer releases); else per file.
    extra = {"tqdm_class": bar} if bar and "tqdm_class" in inspect.signature(hf_hub_download).parameters else {}
    folder: Path | None = None
    for f in files:
        with _hub_errors(name):
            path = hf_hub_download(name, f.name, revision=revision, **extra)
        folder = Path(path).parents[f.name.count("/")]  # the snapshot folder
        done += f.size
        if progress:
            progress(done, total)
    log.debug("downloaded %s (%s) into %s", name, human_size(total), folder)
    return folder


def cached_size(repo_id: str) -> int:
    """Bytes the cached snapshots of `repo_id` take (each file counted once)."""
    blobs = hub_repo_dir(repo_id) / "blobs"
    return sum(p.stat().st_size for p in blobs.glob("*") if p.is_file() and not p.name.endswith(".incomplete"))


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _check_usable(name: str, files: list[HubFile]) -> None:
    names = {f.name for f in files}
    if "config.json" not in names:
        raise HubError(f"{name} has no config.json: it is not a transformers model bertlab can read.")
    if not names & {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}:
        raise HubError(f"{name} has no PyTorch weights (model.safetensors or pytorch_model.bin).")
    if not names & {"tokenizer.json", "vocab.txt", "spm.model"}:
        raise HubError(f"{name} has no tokenizer.json, vocab.txt or spm.model: bertlab cannot read its tokenizer.")


def _progress_class(report: Callable[[int], None]):
    """A tqdm class for huggingface_hub that reports the bytes of the file being downloaded."""
    from huggingface_hub.utils import tqdm

    class _Report(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # no console bar: the caller shows progress its own way
            super().__init__(*args, **kwargs)
            self._seen = int(kwargs.get("initial") or 0)

        def update(self, n=1):
            self._seen += int(n or 0)
            report(self._seen)
            return super().update(n)

    return _Report


class _hub_errors:
    """Turn huggingface_hub's errors into one HubError line a teacher can act on."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, tb) -> bool:
        if error is None or isinstance(error, HubError):
            return False
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        name = self.name
        if isinstance(error, GatedRepoError):
            text = f"{name} is gated: accept its terms on the hub, then log in with `hf auth login`."
        elif isinstance(error, RepositoryNotFoundError):
            text = f"no model named {name} on the Hugging Face hub (check the spelling)."
        elif isinstance(error, RevisionNotFoundError):
            text = f"{name} has no such revision."
        elif isinstance(error, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
            text = (f"{name} cannot be downloaded: the hub cannot be reached (offline, or HF_HUB_OFFLINE=1). "
                    "Run `bertlab download` on a machine with the network.")
        elif isinstance(error, HfHubHTTPError):
            text = f"{name} could not be downloaded: {' '.join(str(error).split())[:160]}"
        elif isinstance(error, OSError) or type(error).__module__.startswith(("httpx", "requests", "urllib3")):
            text = f"{name} could not be downloaded ({type(error).__name__}: {' '.join(str(error).split())[:120]})."
        else:
            return False
        raise HubError(text) from error
