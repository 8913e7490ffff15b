"""The real-size workloads of the benchmarks: a 13.5 M-parameter VGG on 32x32x3 images and a 6.2 M-parameter
transformer text classifier, both from torchspark's zoo, with their synthetic (learnable) data sets.

``bench_throughput.py --models vgg,transformer`` and ``bench_cluster.py --workload transformer`` read them from
:data:`WORKLOADS`. A workload names its zoo model by name and keyword arguments, so a process that builds it (a
TorchDistributor rank, an independent worker) needs nothing but ``torchspark.models.ZOO``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Workload", "WORKLOADS", "zoo_module"]


def zoo_module(model: str, kwargs: dict[str, Any]) -> Any:
    """``torchspark.models.ZOO[model](**kwargs)``: how every process of a benchmark builds the same module."""
    from torchspark.models import ZOO

    return ZOO[model](**kwargs)


@dataclass(frozen=True)
class Workload:
    """A zoo model and its synthetic data set.

    Attributes:
        title: how tables name it (architecture and parameter count).
        model, kwargs: the zoo entry and its arguments (``torchspark.models.ZOO[model](**kwargs)``).
        data: ``"images"`` (``datasets.synthetic_images(n, 3, 32, 32, 10)``) or ``"keywords"``
            (``datasets.synthetic_keywords(n)`` with the model's vocabulary, classes and sequence length).
        n_full, n_quick: samples per epoch of a throughput run (2 cores: one row in about 2-3 minutes) and of
            ``--quick``.
    """

    title: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    data: str = "images"
    n_full: int = 1024
    n_quick: int = 128

    def module(self) -> Any:
        return zoo_module(self.model, self.kwargs)

    def dataset(self, n: int, seed: int = 0) -> Any:
        """``n`` examples; the first ``n`` of a larger call are the same examples (train/test split by slicing)."""
        from torchspark import datasets

        if self.data == "images":
            return datasets.synthetic_images(n, 3, 32, 32, n_classes=self.kwargs.get("n_classes", 10), seed=seed)
        return datasets.synthetic_keywords(
            n,
            seq_len=self.kwargs.get("max_len", 64),
            vocab_size=self.kwargs.get("vocab_size", 20000),
            n_classes=self.kwargs.get("n_classes", 4),
            seed=seed,
        )

    def split(self, n_train: int, n_test: int, seed: int = 0) -> tuple[Any, Any]:
        """A training and a test set of the same task (one call, sliced: the classes' patterns are shared)."""
        from torchspark.data import DataSet

        both = self.dataset(n_train + n_test, seed)
        x, y = both.features, both.labels
        return (
            DataSet(x[:n_train].clone(), y[:n_train].clone()),
            DataSet(x[n_train:].clone(), y[n_train:].clone()),
        )


#: name -> workload (the zoo defaults: 13.5 M and 6.2 M parameters)
WORKLOADS: dict[str, Workload] = {
    "vgg": Workload(
        title="VGG 3x32x32, 13.5 M parameters (zoo `vgg`, batch norm)",
        model="vgg",
        kwargs={"in_channels": 3, "n_classes": 10},
        data="images",
        n_full=1024,
        n_quick=128,
    ),
    "transformer": Workload(
        title="transformer text classifier, 6.2 M parameters (zoo `text_transformer`: 20k vocabulary, 64 tokens)",
        model="text_transformer",
        kwargs={"vocab_size": 20000, "n_classes": 4, "max_len": 64},
        data="keywords",
        n_full=2048,
        n_quick=256,
    ),
}
