"""Training data: [`DataSet`][torchspark.DataSet]/[`MultiDataSet`][torchspark.MultiDataSet], minibatching, and safetensors batch files.

Built-in datasets (scikit-learn digits, synthetic data, MNIST IDX files) live in [`torchspark.datasets`][torchspark.datasets].
"""

from __future__ import annotations

from torchspark.data.batchfiles import (
    batch_num_examples,
    dataset_from_bytes,
    dataset_to_bytes,
    list_batches,
    load_batch,
    save_batch,
    save_batches,
)
from torchspark.data.batching import Batch, iterate_minibatches, rebatch, recut
from torchspark.data.columns import Columns
from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.data.groups import BatchGroup, Trainable, as_group, group_batches, group_examples
from torchspark.data.paths import resolve_paths

__all__ = [
    "Batch",
    "BatchGroup",
    "Columns",
    "as_group",
    "DataSet",
    "batch_num_examples",
    "MultiDataSet",
    "dataset_from_bytes",
    "dataset_to_bytes",
    "group_batches",
    "group_examples",
    "iterate_minibatches",
    "list_batches",
    "load_batch",
    "rebatch",
    "recut",
    "resolve_paths",
    "save_batch",
    "save_batches",
    "Trainable",
]
