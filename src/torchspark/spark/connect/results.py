"""A [`WorkerResult`][torchspark.training.WorkerResult] as bytes without pickle: safetensors for its tensors and
arrays, JSON (in the safetensors metadata) for everything else.

The Connect route sends every worker's result back to the client as output rows
(`torchspark.spark.connect.chunks`); weights never travel as pickle. Any nesting of dicts (string keys), lists,
numbers, strings, torch tensors and numpy arrays round-trips: a tensor or array is stored under its path
(``params``, ``stats/phases/start``) and named in the JSON by ``{"__tensor__": path}`` or ``{"__array__": path}``.

Example: ``decode_result(encode_result(result))`` equals ``result`` (tensors bit for bit; tuples come back as
lists).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import torch

from torchspark.errors import DataError
from torchspark.training.task import WorkerResult

__all__ = ["encode_result", "decode_result", "encode_tree", "decode_tree"]

_META_KEY = "torchspark.tree"
_TENSOR, _ARRAY = "__tensor__", "__array__"


def _flatten(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous().clone()  # safetensors refuses shared storage
        return {_TENSOR: path}
    if isinstance(value, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(value).copy())
        return {_ARRAY: path}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise DataError(f"cannot encode {path or 'the value'}: dict keys must be strings, got {list(value)[:5]}")
        return {k: _flatten(v, f"{path}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise DataError(f"cannot encode {path or 'the value'} of type {type(value).__name__} without pickle")


def _unflatten(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        if set(value) == {_ARRAY}:
            return tensors[value[_ARRAY]].numpy()
        return {k: _unflatten(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_unflatten(v, tensors) for v in value]
    return value


def encode_tree(value: Any) -> bytes:
    """``value`` (dicts, lists, numbers, strings, tensors, numpy arrays) as one safetensors blob."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(value, "", tensors)
    return save(tensors, metadata={_META_KEY: json.dumps(tree)})


def decode_tree(blob: bytes) -> Any:
    """The value `encode_tree` wrote.

    Raises:
        DataError: ``blob`` is not such a payload.
    """
    from safetensors.torch import load

    try:
        tensors = load(blob)
        meta = _metadata(blob)
        return _unflatten(json.loads(meta[_META_KEY]), tensors)
    except (KeyError, ValueError, OSError) as e:
        raise DataError(f"not a torchspark payload ({len(blob)} bytes): {e}") from e


def _metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (the header is 8 bytes of length, then JSON)."""
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + length])
    return dict(header.get("__metadata__") or {})


def encode_result(result: WorkerResult) -> bytes:
    """``result`` as bytes (`encode_tree` of its fields)."""
    return encode_tree({f.name: getattr(result, f.name) for f in dataclasses.fields(result)})


def decode_result(blob: bytes) -> WorkerResult:
    """The [`WorkerResult`][torchspark.training.WorkerResult] `encode_result` wrote."""
    fields = decode_tree(blob)
    return WorkerResult(**fields)
