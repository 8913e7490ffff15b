"""PyTorch data in: a map-style ``Dataset``, an ``IterableDataset`` or a ``DataLoader`` as torchspark batches.

This is the one seam where PyTorch's data meets torchspark's batch types: every batch a ``DataLoader`` yields
(through its ``collate_fn``) becomes a [`DataSet`][torchspark.DataSet] or [`MultiDataSet`][torchspark.MultiDataSet]
by `to_batch`. A ``Dataset`` or ``IterableDataset`` is read through ``DataLoader(data, batch_size)`` (in index
order, PyTorch's default collation). The batch forms accepted:

* a tensor: features without labels (prediction);
* a tuple or list ``(features, labels)`` or ``(features,)``, what ``TensorDataset`` gives: features a tensor, a
  tuple/list of tensors (several inputs, ``module(*features)``) or a dict of named tensors (keyword inputs,
  ``module(**features)``); labels a tensor or a tuple/list of them (several outputs);
* a dict of named tensors, Hugging Face style: its ``"labels"`` (or ``"label"``) entry holds the labels, every
  other entry is a keyword input (``{"input_ids": ..., "attention_mask": ..., "labels": ...}``).

Dtypes are kept: int64 token ids stay int64 (floating features take the network's dtype in the forward pass).

Example: ``batches = list(torch_batches(DataLoader(TensorDataset(x, y), batch_size=32), 32, "fit"))``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.errors import DataError

__all__ = ["ACCEPTED_BATCHES", "LABEL_KEYS", "TORCH_DATA", "is_torch_data", "loader_for", "to_batch", "torch_batches"]

#: the batch forms `to_batch` takes, as error messages list them
ACCEPTED_BATCHES = (
    "a tensor (features), a tuple/list (features, labels) or (features,) whose features are a tensor, a tuple/list "
    "of tensors or a dict of named tensors, or a dict of named tensors with the labels under 'labels'"
)
#: dict entries read as the labels (passed to a model's own loss as ``labels=``); every other entry is a feature
LABEL_KEYS = ("labels", "label")


#: the PyTorch data types (a map-style or iterable ``Dataset``, a ``DataLoader``)
TORCH_DATA = (Dataset, DataLoader)


def is_torch_data(data: Any) -> bool:
    """Whether ``data`` is PyTorch data: a ``torch.utils.data.Dataset`` (map-style or iterable) or a ``DataLoader``."""
    return isinstance(data, TORCH_DATA)


def loader_for(data: Any, batch_size: int) -> DataLoader[Any]:
    """The ``DataLoader`` that reads ``data``: a ``DataLoader`` as it is, a ``Dataset`` or ``IterableDataset``
    in ``batch_size`` batches, in order (no shuffling: shuffle with the loader, or ParallelWrapper's seed)."""
    if isinstance(data, DataLoader):
        return data
    return DataLoader(data, batch_size=batch_size, shuffle=False)


def torch_batches(data: Any, batch_size: int, what: str) -> Iterator[DataSet | MultiDataSet]:
    """Every batch of ``data`` (`loader_for`) as a DataSet/MultiDataSet (`to_batch`), in order.

    Raises:
        DataError: a batch of a form `to_batch` does not take (naming ``what``, its index and type).
    """
    for position, item in enumerate(loader_for(data, batch_size)):
        yield to_batch(item, position, what)


def _tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind not in ("U", "S", "O"):
        return torch.from_numpy(value)
    inner = ""
    if isinstance(value, (list, tuple)) and value:
        inner = f" of {type(value[0]).__name__}"
    raise DataError(f"{where} is a {type(value).__name__}{inner}, not a tensor")


def _labels(value: Any, where: str) -> list[torch.Tensor]:
    if isinstance(value, (list, tuple)):
        return [_tensor(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return [_tensor(value, where)]


def _convert(item: Any) -> DataSet | MultiDataSet | None:
    """``item`` as a batch, None for a form not taken at all; DataError naming the part that is not a tensor."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return item
    if isinstance(item, (torch.Tensor, np.ndarray)):
        return DataSet(_tensor(item, "the batch"))
    if isinstance(item, Mapping):
        keys = [k for k in LABEL_KEYS if k in item]
        if len(keys) > 1:
            raise DataError(f"the batch has both {keys[0]!r} and {keys[1]!r}; keep one as the labels")
        named = {k: _tensor(v, f"entry {k!r}") for k, v in item.items() if k not in LABEL_KEYS}
        if not named:
            raise DataError(f"the batch holds only {sorted(map(str, item))}, no features")
        labels = _labels(item[keys[0]], f"entry {keys[0]!r}") if keys else None
        return MultiDataSet(named, labels)
    if isinstance(item, (tuple, list)) and len(item) in (1, 2):
        feats = item[0]
        labels = _labels(item[1], "its labels (item [1])") if len(item) == 2 else None
        if isinstance(feats, Mapping):
            return MultiDataSet({k: _tensor(v, f"features entry {k!r}") for k, v in feats.items()}, labels)
        if isinstance(feats, (tuple, list)):
            return MultiDataSet([_tensor(v, f"features[{i}]") for i, v in enumerate(feats)], labels)
        x = _tensor(feats, "its features (item [0])")
        if labels is not None and len(labels) == 1:
            return DataSet(x, labels[0])
        return MultiDataSet([x], labels)
    if isinstance(item, (tuple, list)):
        raise DataError(
            f"the batch is a {type(item).__name__} of {len(item)} items; give (features, labels): several inputs "
            "as a tuple or dict in the first place, e.g. ((x1, x2), y), or a dict batch"
        )
    return None


def to_batch(item: Any, position: int, what: str) -> DataSet | MultiDataSet:
    """One PyTorch batch (the forms of this module's docstring) as a DataSet or MultiDataSet.

    Raises:
        DataError: naming ``what``, the batch's index and type, the part that is not usable and the forms taken.
    """
    try:
        batch = _convert(item)
    except DataError as exc:
        raise DataError(
            f"{what}: batch {position} of the data (a {type(item).__name__}) cannot be used: {exc}. Batches may be "
            f"{ACCEPTED_BATCHES}"
        ) from exc
    if batch is None:
        raise DataError(
            f"{what}: batch {position} of the data is a {type(item).__name__}; batches may be {ACCEPTED_BATCHES} "
            "(a collate_fn that returns them, or DataSet/MultiDataSet)"
        )
    return batch
