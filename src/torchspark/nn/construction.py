"""How a [`Network`][torchspark.Network] is put together: its module (an instance re-initialised under a
seed, or a factory run under it) and its optimizer (from the updater spec or the user's callable).

Both run once, in ``Network.__init__``; the optimizer factory is also what
`FlatState` calls to materialise the updater state. Example::

    module = build_module(models.mlp(4, 8, 2), seed=0)   # same weights on every replica
    optimizer = build_optimizer(optim.Adam(lr=1e-3), list(module.parameters()), weight_decay=0.0)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Union

import torch

from torchspark.errors import ConfigError
from torchspark.optim import UpdaterSpec

__all__ = ["ModuleLike", "build_module", "build_optimizer"]

#: what ``Network(module=...)`` takes: a module, or a zero-argument factory returning one
ModuleLike = Union[torch.nn.Module, Callable[[], torch.nn.Module]]


def build_module(module: ModuleLike, seed: int | None) -> torch.nn.Module:
    """The network's module: ``module`` itself (its layers re-initialised with ``reset_parameters`` under ``seed``
    when one is given), or what the factory ``module`` returns when run under ``seed``. The global RNG is left as
    it was either way.

    Raises:
        ConfigError: ``module`` is neither a module nor a callable, or the factory returned something else.
    """
    if isinstance(module, torch.nn.Module):
        if seed is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                for sub in module.modules():
                    reset = getattr(sub, "reset_parameters", None)
                    if callable(reset):
                        reset()
        return module
    if callable(module):
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            built = module()
        if not isinstance(built, torch.nn.Module):
            raise ConfigError(f"module factory returned {type(built).__name__}, expected a torch.nn.Module")
        return built
    raise ConfigError(f"module must be a torch.nn.Module or a zero-argument factory, got {module!r}")


def build_optimizer(
    updater: UpdaterSpec | Callable[..., torch.optim.Optimizer], params: list[torch.nn.Parameter], weight_decay: float
) -> torch.optim.Optimizer:
    """The optimizer over ``params``: an updater spec builds it with ``weight_decay``; a callable is called with
    ``params`` (it takes its own weight decay: ``weight_decay`` must be 0).

    Raises:
        ConfigError: ``weight_decay`` with a callable; the callable raised (the message names it and its error),
            returned something other than a ``torch.optim.Optimizer``, or one whose step needs a closure (LBFGS).
    """
    if isinstance(updater, UpdaterSpec):
        return updater.build(params, weight_decay=weight_decay)
    if weight_decay:
        raise ConfigError(
            f"weight_decay={weight_decay} is handed to torchspark's updater specs only; an optimizer factory takes "
            "its own: functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01)"
        )
    name = repr(updater) if isinstance(updater, functools.partial) else getattr(updater, "__qualname__", repr(updater))
    try:
        opt = updater(params)
    except Exception as e:
        raise ConfigError(
            f"updater factory {name} raised {type(e).__name__}: {e}; it is called with the list of the "
            "network's parameters and must return a torch.optim optimizer over them, e.g. "
            "functools.partial(torch.optim.AdamW, lr=1e-3)"
        ) from e
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"updater callable returned {type(opt).__name__}, expected a torch.optim.Optimizer")
    closure = inspect.signature(opt.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ConfigError(
            f"updater factory {name} returned {type(opt).__name__}, whose step needs a closure (it re-evaluates the "
            "loss several times per step); torchspark steps once per minibatch: use another optimizer "
            "(torch.optim.Adam, SGD, ...)"
        )
    return opt
