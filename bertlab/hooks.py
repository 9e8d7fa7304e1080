"""Hook points (TransformerLens style): identity modules inside the model whose activations
can be read or changed. They hold no parameters, so state dicts stay HF-loadable."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Union

import torch
from torch import nn

# fn(activation, hook_name) -> replacement activation, or None to leave it as it is.
HookFn = Callable[[torch.Tensor, str], Union[torch.Tensor, None]]
# fn(gradient, hook_name) -> replacement gradient, or None: called in the backward pass with the
# gradient of what is differentiated with respect to the hook point's activation (same shape).
GradHookFn = Callable[[torch.Tensor, str], Union[torch.Tensor, None]]
NameFilter = Union[None, str, Iterable[str], Callable[[str], bool]]


class HookPoint(nn.Module):
    """Identity; `name` is its module path, set by `name_hook_points`. `hooks` attaches functions to it
    (as torch forward hooks) and keeps them in `attached`, so that the model can skip work nobody reads."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""
        self.attached: list[Callable] = []  # the forward hooks `hooks` put on this point, in order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when a hook is attached (through `hooks`): lets the model skip work nobody reads."""
        return bool(self.attached)


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
        example = next((n for n in names if n.endswith("hook_pattern")), names[0] if names else "")
        raise KeyError(  # an example from this model: each family names its modules its own way
            f"no hook point named {str(unknown[0])[:80]!r}; names look like {example!r} (see model.hook_names())."
        )
    return wanted


@contextmanager
def hooks(points: dict[str, HookPoint], fwd_hooks: Iterable[tuple[NameFilter, HookFn]],
          bwd_hooks: Iterable[tuple[NameFilter, GradHookFn]] = ()) -> Iterator[None]:
    """Attach `(names, fn)` forward hooks, and backward hooks that see the gradient at those hook
    points, for the duration of the block; always removes them. Nothing is attached for what is not
    asked: the forward pass without hooks (and without gradients) pays nothing."""
    attached: list[tuple[HookPoint, Callable, object]] = []

    def attach(point: HookPoint, hook: Callable) -> None:
        attached.append((point, hook, point.register_forward_hook(hook)))
        point.attached.append(hook)

    try:
        for which, fn in fwd_hooks:
            for name in select(points, which):
                attach(points[name], _wrap(fn, name))
        for which, fn in bwd_hooks:  # after the forward hooks: the gradient of the activation they leave
            for name in select(points, which):
                attach(points[name], _grad_tap(fn, name))
        yield
    finally:
        for point, hook, handle in attached:
            handle.remove()
            point.attached.remove(hook)


def _wrap(fn: HookFn, name: str):
    def hook(module: nn.Module, inputs, output):
        return fn(output, name)

    return hook


def _grad_tap(fn: GradHookFn, name: str):
    """A forward hook that asks autograd to call fn(gradient, name) for this activation (only when
    gradients are being recorded for it: under no_grad it does nothing)."""

    def hook(module: nn.Module, inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: fn(grad, name))

    return hook


class ActivationCache(dict):
    """Activations by hook name, detached; `cache.layer(3, 'hook_pattern')` for short names.

    `layers` is the model's family protocol (anything with `num_layers` and `hook_name(i, short)`,
    e.g. `model.family`): layers are found through it, never by parsing hook names."""

    def __init__(self, *args, layers=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.layers = layers

    def _protocol(self):
        if self.layers is None:
            raise KeyError("this cache does not know its model's layers: make it with model.run_with_cache(...) "
                           "or pass layers=model.family.")
        return self.layers

    def layer(self, index: int, short: str) -> torch.Tensor:
        name = self._protocol().hook_name(index, short)
        if name not in self:
            raise KeyError(f"nothing cached for layer {index} / {short!r} ({name}).")
        return self[name]

    def stack(self, short: str) -> torch.Tensor:
        """The cached layers' `short` activations stacked in layer order: [layer, ...]."""
        proto = self._protocol()
        keys = [k for k in (proto.hook_name(i, short) for i in range(proto.num_layers)) if k in self]
        if not keys:
            raise KeyError(f"nothing cached ends with {short!r}.")
        shapes = [tuple(self[k].shape) for k in keys]
        if len(set(shapes)) > 1:  # a pruned model: its layers kept different numbers of heads
            raise ValueError(f"this model's layers differ in shape at {short} ({', '.join(map(str, shapes[:4]))}"
                             f"{' …' if len(shapes) > 4 else ''}): its attention heads were pruned, so the layers "
                             f"cannot be shown side by side. Look at them one layer at a time, or pick the model "
                             f"it was pruned from.")
        return torch.stack([self[k] for k in keys])

