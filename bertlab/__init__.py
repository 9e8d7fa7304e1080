"""bertlab: an interactive lab for exploring BERT.

    import bertlab
    model, tok = bertlab.load()                      # offline default (MiniLM-L6)
    model, tok = bertlab.load("bert-base-uncased")   # hub name (cache, HF_HUB_OFFLINE honoured)
    model, tok = bertlab.load("path/to/folder")      # config.json + model.safetensors

The names below are imported on first use, so that `import bertlab` (and `bertlab --help`) does not
pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and editors; at run time __getattr__ imports them
    from bertlab.config import BertConfig  # noqa: F401
    from bertlab.families.bert import Bert  # noqa: F401
    from bertlab.loading import load, save_pretrained  # noqa: F401
    from bertlab.model import MissingHeadError, ModelOutput  # noqa: F401
    from bertlab.tokenizer import Encoding, Tokenizer  # noqa: F401
    from bertlab.weights import CheckpointError  # noqa: F401

__version__ = "0.1.0"
_HOME = {
    "BertConfig": "bertlab.config", "CheckpointError": "bertlab.weights", "load": "bertlab.loading",
    "save_pretrained": "bertlab.loading", "Bert": "bertlab.families.bert", "MissingHeadError": "bertlab.model",
    "ModelOutput": "bertlab.model", "Encoding": "bertlab.tokenizer", "Tokenizer": "bertlab.tokenizer",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """`bertlab.load` and the other names above, and any submodule (`bertlab.loading`), imported on first use."""
    home = _HOME.get(name)
    if name.startswith("__"):
        raise AttributeError(f"module 'bertlab' has no attribute {name!r}")
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'bertlab' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
