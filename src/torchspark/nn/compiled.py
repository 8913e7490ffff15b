"""``torch.compile`` for a network's forward pass: the ``compile`` option of [`Network`][torchspark.Network].

Only the forward pass is compiled: ``Network.module`` stays the plain module, so the flat parameter views
(`torchspark.nn.flat`), ``state_dict`` keys (no ``_orig_mod.`` prefix), saving and loading are the same with
or without compilation, and ``params()``/``set_params()``/``apply_update()`` read and write the very tensors the
compiled forward uses (they change parameter values in place, never the tensors themselves).

The setting:

* ``False``: no compilation (the default);
* ``True``: ``torch.compile(module)``, PyTorch's default backend (``"inductor"``: generated kernels, needs a C++
  compiler on CPU, Triton on GPU);
* a mode name (`COMPILE_MODES`: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"``,
  ``"max-autotune-no-cudagraphs"``): the default backend with that mode;
* a backend name (one of `compile_backends`, e.g. ``"inductor"``, ``"aot_eager"``, ``"eager"``).

When it helps: GPU training of mid-sized and large models, where fused kernels cut memory traffic and Python
overhead (often 1.3-2x per step). It costs a compilation at the first step (seconds to a minute, on every worker
replica, again for each new input shape or train/eval mode), so it pays off in long fits, not in a few short
steps; tiny CPU models rarely gain. ``"aot_eager"`` and ``"eager"`` need no compiler: they check that a model
compiles at all, without the speed-up.

Example::

    net = Network(models.lenet(), compile="max-autotune", device="cuda")
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Union

import torch

from torchspark.errors import SetupError
from torchspark.validation import check_choice

__all__ = [
    "COMPILE_MODES",
    "CompileSetting",
    "compile_backends",
    "check_compile",
    "compile_options",
    "CompiledForward",
    "forward_module",
]

log = logging.getLogger(__name__)

#: ``torch.compile`` modes accepted as ``compile=<mode>`` (the default backend with that mode)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

CompileSetting = Union[bool, str]


def compile_backends() -> list[str]:
    """The ``torch.compile`` backends this torch knows (``torch._dynamo.list_backends``, debug ones included)."""
    import torch._dynamo  # deferred: importing dynamo costs a second; only networks that compile need it

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


def check_compile(value: Any) -> CompileSetting:
    """``value`` if it is a valid ``compile`` setting (see the module docstring), else ConfigError listing the modes
    and backends."""
    if isinstance(value, bool):
        return value
    return check_choice(
        "compile",
        value,
        [*COMPILE_MODES, *compile_backends()],
        fix="or True (the default backend) or False (no compilation)",
    )


def compile_options(value: CompileSetting) -> dict[str, Any] | None:
    """``torch.compile`` keyword arguments of a setting (None: do not compile)."""
    if value is False:
        return None
    if value is True:
        return {}
    if value in COMPILE_MODES:
        return {"mode": value}
    return {"backend": value}


class CompiledForward:
    """``torch.compile(module)`` whose backend failures are a [`SetupError`][torchspark.cli.SetupError] naming the
    backend and the fix (instead of dynamo's ``BackendCompilerFailed`` deep in the first training step).

    Compilation happens at the first call (and again for a new input shape or train/eval mode), not here.

    Args:
        module: the network's module; its parameters stay its own (no copy).
        setting: a `check_compile`-ed setting other than False.
    """

    def __init__(self, module: torch.nn.Module, setting: CompileSetting) -> None:
        self.setting = setting
        self.options = compile_options(setting) or {}
        self.compiled = torch.compile(module, **self.options)
        self._first = True

    @property
    def backend(self) -> str:
        """The backend's name (``"inductor"`` for ``True`` and the modes)."""
        return str(self.options.get("backend", "inductor"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch._dynamo.exc import BackendCompilerFailed

        if self._first:
            self._first = False
            log.info(
                "compiling the forward pass (compile=%r, backend %r): the first step takes longer",
                self.setting,
                self.backend,
            )
        try:
            return self.compiled(*args, **kwargs)
        except BackendCompilerFailed as e:
            raise SetupError(
                f"torch.compile backend {self.backend!r} (compile={self.setting!r}) failed on this machine: "
                f"{_reason(e)}. Install what it needs (the 'inductor' backend needs a C++ compiler on CPU, Triton on "
                "GPU), or train without it: compile=False, or compile='aot_eager' (needs no compiler)"
            ) from e


def _reason(error: Exception) -> str:
    """The backend's own error (dynamo wraps it: "backend='inductor' raised: ..."), on one line."""
    inner = getattr(error, "inner_exception", None)
    cause = inner if isinstance(inner, BaseException) else error
    text = " ".join(str(cause).split())[:300]
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def forward_module(module: torch.nn.Module, setting: CompileSetting) -> Callable[..., Any]:
    """What the forward pass calls: ``module`` itself when ``setting`` is False, else a `CompiledForward`."""
    if setting is False:
        return module
    return CompiledForward(module, setting)
