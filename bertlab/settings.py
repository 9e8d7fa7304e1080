"""Where bertlab finds data and keeps its files, read from environment variables."""

from __future__ import annotations

import os
from pathlib import Path


class DataNotFoundError(FileNotFoundError):
    """A data set that is neither in BERTLAB_DATA nor given as a path."""


def data_dir() -> Path:
    """Folder of local data sets (`BERTLAB_DATA`, default `~/.cache/bertlab/data`)."""
    return Path(os.environ.get("BERTLAB_DATA") or Path.home() / ".cache" / "bertlab" / "data").expanduser()


def data_path(*parts: str) -> Path:
    """A file or folder under `data_dir()`; a clear error when it is not there."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise DataNotFoundError(
            f"{path} does not exist. Point BERTLAB_DATA at the folder that holds "
            f"{'/'.join(parts)} (e.g. export BERTLAB_DATA=../shared/data), or pass a path."
        )
    return path


def models_dir() -> Path:
    """Where models trained in bertlab are written (`BERTLAB_MODELS`, default `~/.cache/bertlab/models`)."""
    return Path(os.environ.get("BERTLAB_MODELS") or Path.home() / ".cache" / "bertlab" / "models").expanduser()
