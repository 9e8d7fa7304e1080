"""Hook points (TransformerLens style): identity modules inside the model whose activations
can be read or changed. They hold no parameters, so state dicts stay HF-loadable."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Union

import torch
from torch import nn

# fn(activation, hook_name) -> replacement activation, or None to leave it as it is.
HookFn = Callable[[torch.Tensor, str], Union[torch.Tensor, None]]
NameFilter = Union[None, str, Iterable[str], Callable[[str], bool]]


class HookPoint(nn.Module):
    """Identity; `name` is its module path, set by `name_hook_points`."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when a hook is attached: lets the model skip work nobody reads."""
        return bool(self._forward_hooks)


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Give every HookPoint its full module path as name; return them by name."""
    points = {}
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = name
            points[name] = module
    return points


def select(names: Iterable[str], which: NameFilter) -> list[str]:
    """The hook names picked by `which`: None = all, a name, a list of names, or a predicate."""
    names = list(names)
    if which is None:
        return names
    if callable(which):
        return [n for n in names if which(n)]
    wanted = [which] if isinstance(which, str) else list(which)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise KeyError(
            f"no hook point named {unknown[0]!r}; names look like "
            f"'bert.encoder.layer.0.attention.self.hook_pattern' (see model.hook_names())."
        )
    return wanted


@contextmanager
def hooks(points: dict[str, HookPoint], fwd_hooks: Iterable[tuple[NameFilter, HookFn]]) -> Iterator[None]:
    """Attach `(names, fn)` hooks for the duration of the block; always removes them."""
    handles = []
    try:
        for which, fn in fwd_hooks:
            for name in select(points, which):
                handles.append(points[name].register_forward_hook(_wrap(fn, name)))
        yield
    finally:
        for h in handles:
            h.remove()


def _wrap(fn: HookFn, name: str):
    def hook(module: nn.Module, inputs, output):
        return fn(output, name)

    return hook


class ActivationCache(dict):
    """Activations by hook name, detached; `cache.layer(3, 'hook_pattern')` for short names."""

    def layer(self, index: int, short: str) -> torch.Tensor:
        matches = [k for k in self if f".layer.{index}." in k and k.endswith(short)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} cached activations match layer {index} / {short!r}.")
        return self[matches[0]]

    def stack(self, short: str) -> torch.Tensor:
        """All layers' `short` activations stacked: [layer, ...]."""
        keys = sorted((k for k in self if ".layer." in k and k.endswith(short)), key=_layer_index)
        if not keys:
            raise KeyError(f"nothing cached ends with {short!r}.")
        return torch.stack([self[k] for k in keys])


def _layer_index(name: str) -> int:
    return int(name.split(".layer.")[1].split(".")[0])


def caching_hooks(cache: ActivationCache, which: NameFilter, points: dict[str, HookPoint]):
    """Hooks that store a detached copy of each selected activation into `cache`."""

    def store(x: torch.Tensor, name: str) -> None:
        cache[name] = x.detach()

    return [(select(points, which), store)]
