"""Option types shared by the command-line tools: a wrong value is refused while the command line is
read, in one line, before any model or data set loads. Light on purpose (no torch at import), so
`bertlab --help` stays fast; CUDA is looked for only when a CUDA device is asked for.

    p.add_argument("--device", type=options.device, default="auto", help=options.DEVICE_HELP)
    p.add_argument("--data", type=options.existing_path, help="a data file or folder")
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DEVICE_HELP = "auto (default: CUDA when available, else the CPU), cpu, cuda or cuda:N, mps"
_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")


def device(text: str) -> str:
    """argparse type of --device: auto, cpu, cuda, cuda:N or mps; CUDA only where there is one."""
    name = text.strip().lower()
    if not _DEVICE.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a device bertlab can use: give auto, cpu, cuda, "
                                         f"cuda:N or mps")
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{name}: CUDA is not available on this machine: give auto or cpu")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{name}: this machine has {torch.cuda.device_count()} CUDA "
                                             f"device(s), numbered from 0")
    elif name == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError("mps: Apple's GPU is not available on this machine: give auto or cpu")
    return name


def path_text(text: str) -> str:
    """argparse type of a file or folder name: refused in one line (the value shortened) when it is too
    long to be a path at all, before anything looks for it."""
    from bertlab.inputs import InputError, check_path_text

    try:
        return check_path_text(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def existing_path(text: str) -> str:
    """argparse type of an input file or folder that must exist (returned as given)."""
    if not Path(path_text(text)).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{text[:200]!r}: no such file or folder")
    return text


def model_source(text: str) -> str:
    """argparse type of --model: a folder (which must exist when the text is clearly a path) or a hub name."""
    path_text(text)
    if text.startswith((".", "/", "~")) and not Path(text).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{text[:200]!r}: no such folder (give a model folder, a Hugging Face "
                                         f"name such as bert-base-uncased, or leave --model out)")
    return text


def positive_int(text: str) -> int:
    """argparse type of a count that must be 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value
