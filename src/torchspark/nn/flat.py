"""A network's flat state: every parameter a view into one contiguous 1-D buffer, and the optimizer's state and the
module's floating-point buffers read and written as flat vectors.

DL4J's MultiLayerNetwork and ComputationGraph kept all parameters in one flat array; so does `FlatState`:
``params()``, ``set_params()`` and the all-reduces of the training masters touch a single tensor instead of one per
layer. [`Network`][torchspark.Network] holds one and offers its methods under the same names.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from torchspark.errors import ConfigError, DataError

__all__ = ["FlatState", "OptimizerFactory"]

log = logging.getLogger(__name__)

#: builds the optimizer over a list of parameters (the network's updater with its weight decay)
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def _flatten(params: list[torch.nn.Parameter], channels_last: bool) -> torch.Tensor:
    """One buffer holding every parameter; each parameter's data becomes a view into it."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise ConfigError(f"all parameters must share one floating dtype, got {sorted(map(str, dtypes))}")
    # each tensor enters the flat buffer in its memory order: (N, H, W, C) for channels_last 4-D weights
    flat = torch.cat(
        [(p.detach().permute(0, 2, 3, 1) if channels_last and p.dim() == 4 else p.detach()).reshape(-1) for p in params]
    )
    offset = 0
    for p in params:
        n = p.numel()
        part = flat[offset : offset + n]
        if channels_last and p.dim() == 4:
            size = p.shape
            p.data = part.view(size[0], size[2], size[3], size[1]).permute(0, 3, 1, 2)
        else:
            p.data = part.view_as(p)
        offset += n
    return flat


def _materialize_updater_state(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], make_optimizer: OptimizerFactory
) -> None:
    """Create every optimizer state tensor now (zeros), so the flat updater view has a fixed layout.

    First the optimizer's own lazy initialisation (``_init_group``, which every ``torch.optim`` optimizer but SGD
    has) creates the state a first step would start from: zeros for Adam(W), RMSprop, AdaGrad, but also NAdam's
    ``mu_product`` of 1, ASGD's ``eta``/``mu`` and Rprop's step sizes. What is still missing (SGD's momentum, an
    optimizer without ``_init_group``) is discovered by stepping a throw-away optimizer once with zero gradients on
    zero-filled clones, and created as zeros: "before the first step" for SGD momentum.
    """
    _init_groups(optimizer, params)
    missing = [i for i, p in enumerate(params) if not optimizer.state.get(p)]
    if not missing:
        return
    clones = [torch.nn.Parameter(torch.zeros_like(p)) for p in params]
    for c in clones:
        c.grad = torch.zeros_like(c)
    probe = make_optimizer(clones)
    probe.step()
    for i in missing:
        state = probe.state.get(clones[i], {})
        optimizer.state[params[i]] = {k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _init_groups(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """Run the optimizer's ``_init_group(group, *lists)`` (torch's private lazy state initialisation) with zero
    gradients, when it has one; an optimizer whose ``_init_group`` takes other arguments is left as it is."""
    init = getattr(optimizer, "_init_group", None)
    if init is None:
        return
    try:
        lists = len(inspect.signature(init).parameters) - 1
    except (TypeError, ValueError):
        return
    saved = [p.grad for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for group in optimizer.param_groups:
            init(group, *[[] for _ in range(lists)])
    except Exception as e:  # a signature this does not know: fall back to the probe
        log.debug("%s._init_group could not be called (%s); probing the state layout", type(optimizer).__name__, e)
        optimizer.state.clear()
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _scatter(tensors: list[torch.Tensor], flat: Any, what: str) -> None:
    """Copy consecutive slices of the 1-D ``flat`` into ``tensors`` (in their logical layout and dtypes)."""
    size = sum(t.numel() for t in tensors)
    flat = torch.as_tensor(flat)
    if flat.dim() != 1 or flat.numel() != size:
        raise DataError(f"{what} needs a 1-D tensor of {size} values, got shape {tuple(flat.shape)}")
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def _gather(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not tensors:
        return torch.zeros(0, dtype=torch.float32, device=device)
    return torch.cat([t.detach().reshape(-1).to(torch.float32, copy=True) for t in tensors])


class FlatState:
    """A module's parameters in one flat buffer, with its optimizer's state and its buffers as flat vectors.

    Args:
        module: the network's module, already on its device and in its memory format.
        channels_last: 4-D weights enter the buffer in their (N, H, W, C) memory order.
        make_optimizer: builds the optimizer over a list of parameters; called for the parameters, and once more on
            zero clones to discover the optimizer's state layout (which is then created, zero, up front).
    Raises:
        ConfigError: a module without parameters, or with parameters of several or non-floating dtypes.

    Example: ``state = FlatState(module, False, lambda ps: torch.optim.Adam(ps))``; ``state.params()`` is a 1-D copy
    of every parameter and ``state.set_params(v)`` writes them all at once.
    """

    def __init__(self, module: torch.nn.Module, channels_last: bool, make_optimizer: OptimizerFactory) -> None:
        self.module = module
        #: the module's parameters, in ``module.parameters()`` order; each one's data is a view into `flat`
        self.parameters: list[torch.nn.Parameter] = list(module.parameters())
        if not self.parameters:
            raise ConfigError(f"module {type(module).__name__} has no parameters to train")
        #: the live flat parameter buffer
        self.flat = _flatten(self.parameters, channels_last)
        self.optimizer = make_optimizer(self.parameters)
        _materialize_updater_state(self.optimizer, self.parameters, make_optimizer)
        #: the state tensors that do not start at zero (NAdam's ``mu_product``, Rprop's step sizes), by position
        #: in `updater_state_tensors`, as they start: what `reset_updater_state` puts back
        self._initial_state = {
            i: t.detach().clone() for i, t in enumerate(self.updater_state_tensors()) if bool(t.any())
        }

    # -- parameters
    def num_params(self) -> int:
        """Number of trainable scalars (the length of `params`)."""
        return self.flat.numel()

    def params(self) -> torch.Tensor:
        """A 1-D copy of all parameters, in ``module.parameters()`` order."""
        return self.flat.detach().clone()

    def set_params(self, flat: torch.Tensor) -> None:
        """Overwrite all parameters from a 1-D tensor of length `num_params`."""
        flat = torch.as_tensor(flat)
        if flat.dim() != 1 or flat.numel() != self.flat.numel():
            raise DataError(
                f"set_params needs a 1-D tensor of {self.flat.numel()} values, got shape {tuple(flat.shape)}"
            )
        with torch.no_grad():
            self.flat.copy_(flat)

    def apply_update(self, update: torch.Tensor) -> None:
        """``params -= update`` (a flat tensor of length `num_params`)."""
        if update.dim() != 1 or update.numel() != self.flat.numel():
            raise DataError(
                f"apply_update needs a 1-D tensor of {self.flat.numel()} values, got shape {tuple(update.shape)}"
            )
        with torch.no_grad():
            self.flat.sub_(update.to(self.flat.device, self.flat.dtype))

    def apply_update_at(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """``params[indices] -= values``: `apply_update` of an update that is zero except at ``indices``
        (unique int64 indices). Bit-identical to it (``x - 0`` is ``x``), but touches only those elements."""
        if indices.dim() != 1 or indices.shape != values.shape:
            raise DataError(
                f"apply_update_at needs 1-D indices and values of one length, got shapes "
                f"{tuple(indices.shape)} and {tuple(values.shape)}"
            )
        with torch.no_grad():
            values = values.to(self.flat.device, self.flat.dtype)
            if self.flat.device.type == "cpu":  # numpy fancy indexing: ~5x less overhead than torch's for few entries
                flat, at = self.flat.detach().numpy(), indices.numpy()
                flat[at] = flat[at] - values.numpy()
            else:
                idx = indices.to(self.flat.device)
                self.flat[idx] = self.flat[idx] - values

    def clear_grads(self) -> None:
        """``optimizer.zero_grad(set_to_none=True)`` for the parameters (the optimizer's own), without the profiler
        record that call opens: a measurable share of a small network's step (BENCHMARKS.md, "Where the step
        goes"), paid twice per step."""
        for p in self.parameters:
            p.grad = None

    # -- updater state
    def updater_state_tensors(self) -> list[torch.Tensor]:
        """The live optimizer state tensors, in `updater_state` order (no copy; writes change the updater)."""
        out: list[torch.Tensor] = []
        for p in self.parameters:
            state = self.optimizer.state.get(p, {})
            out.extend(v for _, v in sorted(state.items()) if isinstance(v, torch.Tensor))
        return out

    def updater_state_size(self) -> int:
        """Length of `updater_state` (0 for plain SGD)."""
        return sum(t.numel() for t in self.updater_state_tensors())

    def updater_state(self) -> torch.Tensor:
        """All optimizer state as one float32 1-D tensor, in a stable order (zeros before the first step)."""
        return _gather(self.updater_state_tensors(), self.flat.device)

    def set_updater_state(self, flat: torch.Tensor) -> None:
        """Overwrite all optimizer state from `updater_state` output."""
        _scatter(self.updater_state_tensors(), flat, "set_updater_state")

    def reset_updater_state(self) -> None:
        """Put the optimizer state back as before the first step (zeros, except what starts elsewhere)."""
        with torch.no_grad():
            for i, t in enumerate(self.updater_state_tensors()):
                initial = self._initial_state.get(i)
                if initial is None:
                    t.zero_()
                else:
                    t.copy_(initial)

    # -- buffers
    def buffer_tensors(self) -> list[torch.Tensor]:
        """The live floating-point buffers (BatchNorm running mean/var), in ``module.buffers()`` order.

        Training masters average these with the parameters (DL4J kept them in its parameter vector). Integer
        buffers such as ``num_batches_tracked`` are not in this list: they count steps, which all workers take in
        lockstep, and the driver takes worker 0's (see `buffer_state`)."""
        return [b for b in self.module.buffers() if b.is_floating_point()]

    def buffer_size(self) -> int:
        """Length of `buffers` (0 for modules without floating-point buffers)."""
        return sum(b.numel() for b in self.buffer_tensors())

    def buffers(self) -> torch.Tensor:
        """All floating-point buffers as one float32 1-D copy (empty when the module has none)."""
        return _gather(self.buffer_tensors(), self.flat.device)

    def set_buffers(self, flat: torch.Tensor) -> None:
        """Overwrite the floating-point buffers from `buffers` output."""
        _scatter(self.buffer_tensors(), flat, "set_buffers")

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Every buffer by name, integer ones included, as CPU copies (what a worker hands back to the driver)."""
        return {name: b.detach().cpu().clone() for name, b in self.module.named_buffers()}

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `buffer_state` output into this network's buffers (names it does not have are ignored)."""
        with torch.no_grad():
            for name, b in self.module.named_buffers():
                if name in state:
                    b.copy_(torch.as_tensor(state[name]).to(b.device, b.dtype))
