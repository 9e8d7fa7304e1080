"""bertlab: an interactive lab for exploring BERT.

    import bertlab
    model, tok = bertlab.load()                      # offline default (MiniLM-L6)
    model, tok = bertlab.load("bert-base-uncased")   # hub name (cache, HF_HUB_OFFLINE honoured)
    model, tok = bertlab.load("path/to/folder")      # config.json + model.safetensors
"""

from bertlab.config import BertConfig
from bertlab.loading import load, save_pretrained
from bertlab.model import Bert, MissingHeadError, ModelOutput
from bertlab.tokenizer import Encoding, Tokenizer
from bertlab.weights import CheckpointError

__version__ = "0.1.0"
__all__ = [
    "Bert", "BertConfig", "CheckpointError", "Encoding", "MissingHeadError", "ModelOutput", "Tokenizer",
    "load", "save_pretrained",
]
