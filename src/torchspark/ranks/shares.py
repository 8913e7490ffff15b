"""A rank's share of ``run(..., data=...)``: its rows, streamed once into an Arrow IPC file on the rank's own disk
(never gathered on the driver), then read memory-mapped every epoch in an order drawn from ``seed + epoch``.

On Spark the share is the rank's partition of the repartitioned DataFrame, arriving as the barrier
``mapInArrow`` stage's record batches; on one machine a pyarrow Table / pandas DataFrame split by row.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["DataShare", "spool"]


def _column_tensor(column: Any) -> Any:
    """One Arrow column as a tensor: numbers as they are, lists / fixed-size lists of numbers as ``(rows, width)``;
    anything else (strings...) as a Python list."""
    import pyarrow as pa

    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return torch.from_numpy(np.asarray(column.to_numpy(zero_copy_only=False)).copy())
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        rows = len(column)
        values = np.asarray(column.flatten().to_numpy(zero_copy_only=False))
        if rows and values.size % rows == 0:
            return torch.from_numpy(values.reshape(rows, -1).copy())
    return column.to_pylist()


@dataclass(frozen=True)
class DataShare:
    """A rank's rows in the Arrow IPC file at ``path`` (``rows`` of them)."""

    path: str
    rows: int

    def batches(
        self, seed: int, batch_size: int, columns: Sequence[str] | None = None, shuffle: bool = True
    ) -> Iterator[dict[str, Any]]:
        """One pass over the rows: dicts of column -> tensor of ``batch_size`` rows, shuffled by ``seed``."""
        import pyarrow as pa

        if batch_size < 1:
            from torchspark.errors import ConfigError

            raise ConfigError(f"data(batch_size={batch_size}): pass a batch size of at least 1")
        with pa.memory_map(self.path) as source:
            table = pa.ipc.open_file(source).read_all()
        if columns is not None:
            table = table.select(list(columns))
        order = np.random.default_rng(seed).permutation(table.num_rows) if shuffle else np.arange(table.num_rows)
        for start in range(0, table.num_rows, batch_size):
            part = table.take(pa.array(order[start : start + batch_size]))
            yield {name: _column_tensor(part.column(name)) for name in part.column_names}


def spool(batches: Iterable[Any], path: str, schema: Any = None) -> DataShare:
    """Write record ``batches`` (``pyarrow.RecordBatch``) to an Arrow IPC file at ``path`` as they arrive (a temp
    name, then a rename); the `DataShare` reading it. ``schema``: the batches' schema when there may be none."""
    import pyarrow as pa

    tmp = f"{path}.tmp-{os.getpid()}"
    rows = 0
    writer = None
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(tmp, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is None:
            writer = pa.ipc.new_file(tmp, schema if schema is not None else pa.schema([]))
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)
    return DataShare(path, rows)
