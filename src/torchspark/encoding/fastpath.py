"""The one-pass CPU encode: a compiled kernel when ``torchspark[fast]`` (numba) is installed, else the numpy path.

[`threshold_encode`][torchspark.encoding.threshold_encode] on a CPU residual runs steps 1-3 (add the update, find the entries at
or above the threshold, subtract their ``±t`` and write the message) in **one pass** over the update with the
compiled kernel: about 12 bytes moved per element (read residual and update, write residual), where the numpy path
makes several passes. Same message bytes and same residual, bit for bit. CUDA tensors keep the torch kernels.

Install it with ``pip install 'torchspark[fast]'`` (numba + llvmlite wheels, ~40 MB, no compiler needed). Without it,
or when numba cannot load or compile the kernel, the codec uses the numpy path and logs the reason once per process
(INFO when numba is not installed, WARNING when it is installed but unusable). The first CPU encode of a process
loads the kernel (~0.3 s; a few seconds the very first time on a machine, when numba compiles it into its cache:
``__pycache__`` beside the module when writable, else the user's cache directory, or ``NUMBA_CACHE_DIR``).

Check what a process uses::

    from torchspark.encoding import fast_path_status
    print(fast_path_status())   # FastPathStatus(available=True, backend='numba 0.68.1', reason=None, encodes=0)
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
import torch

from torchspark.encoding import _kernels

__all__ = ["FastPathStatus", "OnePassKernel", "fast_path_status", "load_kernel", "loaded_kernel", "kernel"]

log = logging.getLogger(__name__)

Format = Literal["sparse", "bitmap", "empty"]


@dataclass(frozen=True)
class FastPathStatus:
    """What this process's CPU encodes run on.

    Attributes:
        available: True when the compiled one-pass kernel is loaded and passed its self-check.
        backend: ``"numba <version>"`` or ``"numpy"`` (the multi-pass fallback).
        reason: why the kernel is not used (None when it is): what to install or fix.
        encodes: how many encodes the kernel has run in this process (grows with every CPU
            [`threshold_encode`][torchspark.encoding.threshold_encode]; a check that the fast path really runs).
    """

    available: bool
    backend: str
    reason: str | None
    encodes: int


class OnePassKernel:
    """The loaded kernel (see `load_kernel`); ``encodes`` counts its calls."""

    def __init__(self, module: ModuleType, version: str) -> None:
        self._module = module
        self.version = version
        self.encodes = 0

    def encode(
        self, residual: torch.Tensor, update: torch.Tensor | None, threshold: float, min_entries: int, cap: int
    ) -> tuple[Format, torch.Tensor, int]:
        """Steps 1-3 of [`threshold_encode`][torchspark.encoding.threshold_encode] on validated CPU tensors, in one pass:
        ``(format, payload, count)``; ``residual`` changed in place exactly as the numpy path changes it."""
        self.encodes += 1
        r = residual.detach().numpy()
        u = r if update is None else update.detach().numpy()  # r: an unused stand-in, so one compiled signature
        n = r.shape[0]
        limit = _kernels.bitmap_nbytes(n) // 4  # the largest count the sparse format wins at
        sparse = np.empty(min(limit, cap) + 1, dtype=np.int32)  # + 1: the kernel's spare slot
        n_saved = min(min_entries - 1, n, cap)  # enough to undo a message that stays below min_entries
        saved_pos = np.empty(n_saved, dtype=np.int64)
        saved_val = np.empty(n_saved, dtype=np.float32)
        count, bitmap = self._module.encode(
            r, u, update is not None, np.float32(threshold), limit, cap, sparse, saved_pos, saved_val
        )
        if count < min_entries:  # nothing is sent: put back what the pass subtracted
            r[saved_pos[:count]] = saved_val[:count]
            return "empty", torch.empty(0, dtype=torch.int32), 0
        if count <= limit:
            return "sparse", torch.from_numpy(sparse[:count].copy()), count
        return "bitmap", torch.from_numpy(bitmap), count


def load_kernel() -> OnePassKernel | str:
    """Import, compile (or load from numba's cache) and self-check the kernel: the kernel, or why not (a reason
    naming the fix). Uncached: `kernel` is the per-process accessor."""
    try:
        numba = importlib.import_module("numba")
    except ModuleNotFoundError as e:
        return f"numba is not installed ({e}); pip install 'torchspark[fast]' for the one-pass CPU encode"
    except Exception as e:  # noqa: BLE001 - e.g. numba refusing this numpy version: fall back, say why
        return (
            f"numba cannot be imported ({type(e).__name__}: {e}); "
            "pip install -c constraints.txt 'torchspark[fast]' installs versions that work together"
        )
    try:
        module = importlib.import_module("torchspark.encoding._onepass_kernel")
        found = OnePassKernel(module, f"numba {numba.__version__}")
        _self_check(found)
    except Exception as e:  # noqa: BLE001 - any failure (numpy too new, LLVM, unwritable cache) means: fall back
        return (
            f"numba {getattr(numba, '__version__', '?')} cannot run the one-pass kernel ({type(e).__name__}: {e}); "
            "reinstall with pip install 'torchspark[fast]' (pinned versions: constraints.txt), or set "
            "NUMBA_CACHE_DIR to a writable directory"
        )
    found.encodes = 0
    return found


def _self_check(found: OnePassKernel) -> None:
    """Compile on a small update (sparse and bitmap messages) and compare with the numpy path, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    update = torch.randn(1000, generator=gen)
    for t in (2.5, 0.5):  # ~1% (sparse) and ~60% (bitmap) of the entries
        ours, reference = torch.zeros(1000), torch.zeros(1000)
        fmt, payload, count = found.encode(ours, update, t, 1, 1000)
        ref_count, indices = _kernels.accumulate_and_find(
            reference, update, t, _kernels.bitmap_nbytes(1000) // 4, False
        )
        if indices is not None:
            expected = _kernels.apply_sparse(reference, indices, t, False)
        else:
            expected = _kernels.apply_bitmap(reference, t, False)
        if count != ref_count or not torch.equal(payload, expected) or not torch.equal(ours, reference):
            raise RuntimeError(f"self-check failed: the {fmt} message differs from the numpy path's")


@functools.cache
def loaded_kernel() -> OnePassKernel | str:
    """This process's `load_kernel`, loaded on the first call; the reason is logged once when unavailable
    (``loaded_kernel.cache_clear()`` loads it again)."""
    found = load_kernel()
    if isinstance(found, str):
        level = logging.INFO if found.startswith("numba is not installed") else logging.WARNING
        log.log(level, "threshold codec: using the numpy path: %s", found)
    return found


def kernel() -> OnePassKernel | None:
    """This process's kernel, or None when it is unavailable (the numpy path is used)."""
    found = loaded_kernel()
    return None if isinstance(found, str) else found


def fast_path_status() -> FastPathStatus:
    """Whether CPU encodes in this process use the one-pass kernel (loads it if not loaded yet), and why not.

    Example: ``assert fast_path_status().available, fast_path_status().reason`` in a job that must be fast."""
    found = loaded_kernel()
    if isinstance(found, str):
        return FastPathStatus(False, "numpy", found, 0)
    return FastPathStatus(True, found.version, None, found.encodes)
