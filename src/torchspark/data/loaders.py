"""Checks on what a user's ``loader`` (``fit_paths(loader=...)``: a function ``path -> DataSet``) returns.

A network takes one shape per example, so every file a loader reads must give the same per-example shapes.
The path methods run the loader on every file to count its examples; `check_same_shapes` compares what
each call returned there, so a loader that returns a wrong shape for one file fails before any worker starts,
with a message naming the loader, the file, the shape expected (that of the first file) and the shape it got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.errors import DataError

__all__ = ["loader_name", "example_shapes", "check_same_shapes"]


def loader_name(loader: Callable[..., Any]) -> str:
    """The loader's qualified name for messages (``png_loader``, ``MyLoader.__call__``, or its type)."""
    name = getattr(loader, "__qualname__", None) or getattr(getattr(loader, "func", None), "__qualname__", None)
    return str(name) if name else type(loader).__name__


def _per_example(tensors: Sequence[torch.Tensor | None]) -> str:
    return ", ".join(
        "none" if t is None else f"{tuple(t.shape[1:])} {str(t.dtype).replace('torch.', '')}" for t in tensors
    )


def example_shapes(batch: DataSet | MultiDataSet) -> str:
    """Per-example shapes and dtypes of ``batch``'s features and labels, e.g. ``features (7,) float32; labels
    () int64`` (the first dimension, the number of examples, left out)."""
    if isinstance(batch, DataSet):
        feats: list[torch.Tensor | None] = [batch.features]
        labels: list[torch.Tensor | None] = [] if batch.labels is None else [batch.labels]
    else:
        feats, labels = list(batch.features), list(batch.labels or [])
    return f"features {_per_example(feats)}; labels {_per_example(labels) if labels else 'none'}"


def check_same_shapes(loader: Callable[..., Any], shapes: Sequence[tuple[str, str]]) -> None:
    """DataError unless every ``(path, example_shapes)`` agrees with the first one.

    Raises:
        DataError: the message names the loader, the file, the shape expected (the first file's) and the shape
            it got, and the fix.
    """
    if not shapes:
        return
    first_path, expected = shapes[0]
    for path, got in shapes[1:]:
        if got != expected:
            raise DataError(
                f"the loader {loader_name(loader)} returned the wrong shape for {path}: expected {expected} per "
                f"example (as for {first_path}), got {got}; every file must give the same shape: fix the loader "
                "(resize/reshape in it) or leave that file out"
            )
