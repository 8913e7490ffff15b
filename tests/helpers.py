"""Factories and assertions shared by the tests: small networks, small data sets, an in-process fit, and the check
that every replica of a fit ended bit-identical.

Importable from every test folder the way :mod:`reference_loops` is: pytest puts ``tests/`` (the folder of the
root ``conftest.py``) on ``sys.path``. Each factory takes as parameters what its callers vary, so every test keeps
its own numbers (sizes, seeds, learning rates) at the call site::

    from helpers import assert_replicas_identical, classification_batches, fit_in_process, mlp_net

    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))
    results = fit_in_process(net, "sharing", SharingSettings().to_dict(), [classification_batches(4, seed=1)] * 2)
    assert_replicas_identical(results, 2, net=net)

Only torch-only modules are imported here (no pyspark), so the unit tests can use every helper.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.nn import NetworkBlueprint
from torchspark.stats import TrainingStats
from torchspark.training import InProcessRunner, ItemSource, WorkerResult, WorkerTask, merge_results
from torchspark.training.task import param_checksum

__all__ = [
    "averaging_only",
    "mlp_net",
    "lenet_net",
    "batchnorm_net",
    "classification_batches",
    "uniform_data",
    "uniform_batches",
    "parts_of_sizes",
    "onehot_rule_data",
    "indexed_data",
    "fit_in_process",
    "HoldsResults",
    "ChecksumSource",
    "rank_checksums",
    "assert_replicas_identical",
]


# ------------------------------------------------------------------ networks
def mlp_net(
    n_in: int,
    hidden: int,
    n_out: int,
    *,
    updater: optim.UpdaterSpec | None = None,
    seed: int = 0,
    **network_options: Any,
) -> Network:
    """``Network(models.mlp(n_in, hidden, n_out), updater=updater, seed=seed, **network_options)``.

    Args:
        n_in, hidden, n_out: the layer widths (see :func:`torchspark.models.mlp`).
        updater: the optimizer; None leaves the Network's default.
        seed: the Network's seed (same seed, same initial parameters).
        network_options: any other :class:`~torchspark.Network` argument (``loss=``, ``weight_decay=``, ...).

    Example: ``mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))``.
    """
    return Network(models.mlp(n_in, hidden, n_out), updater=updater, seed=seed, **network_options)


def lenet_net(
    *, updater: optim.UpdaterSpec | None = None, seed: int = 0, side: int = 8, **network_options: Any
) -> Network:
    """LeNet for ``side`` x ``side`` one-channel images and 10 classes (8: the digits data set).

    Args:
        updater: the optimizer; None leaves the Network's default.
        seed: the Network's seed.
        side: the image height and width.
        network_options: any other :class:`~torchspark.Network` argument (``memory_format=``, ...).

    Example: ``lenet_net(updater=optim.Adam(lr=1e-3))`` trains on ``datasets.digits("train")``.
    """
    return Network(models.lenet(1, 10, side, side), updater=updater, seed=seed, **network_options)


def batchnorm_net(*, updater: optim.UpdaterSpec | None = None, seed: int = 0) -> Network:
    """A 12 -> 16 -> 3 perceptron with a BatchNorm1d after its hidden layer: a network with running statistics
    (buffers) besides its parameters. The module is ``net.module``; ``net.module[1]`` is the BatchNorm.

    Example: ``batchnorm_net(updater=optim.SGD(lr=0.1))`` on :func:`classification_batches` (12 features).
    """
    module = torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    return Network(module, updater=updater, seed=seed)


# ------------------------------------------------------------------ data
def classification_batches(
    n_batches: int, seed: int, *, size: int = 8, n_features: int = 12, n_classes: int = 3
) -> list[DataSet]:
    """``n_batches`` minibatches of ``size`` from :func:`torchspark.datasets.synthetic_classification`
    (Gaussian blobs; same seed, same batches).

    Example: ``classification_batches(6, seed=1)`` -> six batches of 8 examples, 12 features, 3 classes.
    """
    return datasets.synthetic_classification(n_batches * size, n_features, n_classes, seed=seed).split(size)


def uniform_data(n: int, *, seed: int = 0, shape: Sequence[int] = (1, 8, 8), classes: int = 10) -> DataSet:
    """``n`` examples of uniform noise in [0, 1) of ``shape`` with uniform random labels in ``[0, classes)``,
    drawn features first, then labels, from one generator seeded with ``seed``. Nothing to learn: for tests of
    mechanics (averaging weights, step counts), not of accuracy.

    Example: ``uniform_data(64, seed=0)`` -> digits-shaped ``(64, 1, 8, 8)`` features, labels in 0..9.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return DataSet(x, y)


def uniform_batches(
    n_batches: int, *, seed: int = 0, size: int = 8, shape: Sequence[int] = (1, 8, 8), classes: int = 10
) -> list[DataSet]:
    """:func:`uniform_data` of ``n_batches * size`` examples split into minibatches of ``size``.

    Example: ``uniform_batches(2, size=8, seed=1)`` -> two batches of 8.
    """
    return uniform_data(n_batches * size, seed=seed, shape=shape, classes=classes).split(size)


def parts_of_sizes(sizes: Sequence[int], *, n_features: int, seed: int, n_classes: int = 3) -> list[DataSet]:
    """One :func:`~torchspark.datasets.synthetic_classification` data set of ``sum(sizes)`` examples cut into
    consecutive parts of the given sizes (unequal partitions, for assignment and repartition tests).

    Example: ``parts_of_sizes([5, 0, 3], n_features=4, seed=1)`` -> parts of 5, 0 and 3 examples.
    """
    data = datasets.synthetic_classification(sum(sizes), n_features, n_classes, seed=seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [data.slice(a, b) for a, b in zip(offsets[:-1], offsets[1:])]


def onehot_rule_data(n: int, *, seed: int = 3) -> DataSet:
    """``n`` examples of 12 Gaussian features whose class (3 of them) follows a fixed rule on the first three
    features, with one-hot float targets: learnable, so a resumed fit and an uninterrupted one can be compared.

    Example: ``onehot_rule_data(96)`` -> features ``(96, 12)``, targets ``(96, 3)``.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    y = torch.nn.functional.one_hot((x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long(), 3).float()
    return DataSet(x, y)


def indexed_data(n: int) -> DataSet:
    """Row ``i`` has features ``(i, -i)`` and label ``i % 3``: a batch's first feature column says which rows it
    holds (for tests of shuffling and assignment).

    Example: ``indexed_data(40).features[:, 0]`` is ``0, 1, ..., 39``.
    """
    ids = torch.arange(n, dtype=torch.float32)
    return DataSet(torch.stack([ids, -ids], 1), torch.arange(n) % 3)


# ------------------------------------------------------------------ fits
def fit_in_process(
    net: Network,
    mode: str,
    settings: Mapping[str, Any],
    shards: Sequence[Iterable[Any]],
    *,
    epochs: int = 1,
    prefetch: int = 0,
    timeout_s: float = 30.0,
    merge: bool = True,
    **task_options: Any,
) -> list[WorkerResult]:
    """Run one worker per shard on threads of this process (:class:`~torchspark.training.InProcessRunner`) from
    ``net``'s blueprint, and (``merge``) apply the results to ``net``.

    Args:
        net: the driver's network; its parameters are the workers' start.
        mode: the algorithm, ``"averaging"`` or ``"sharing"``.
        settings: the algorithm's settings dict (``SharingSettings(...).to_dict()``,
            ``{"averaging_frequency": 2, "save_updater": True}``).
        shards: one list of minibatches (or other worker items) per worker.
        epochs, prefetch: as in :class:`~torchspark.training.WorkerTask`.
        timeout_s: the runner's collective timeout.
        merge: apply the results to ``net`` (:func:`~torchspark.training.merge_results`).
        task_options: any other :class:`~torchspark.training.WorkerTask` field (``flush_denormal=``, ...).

    Returns:
        The workers' results, in rank order.

    Example: ``fit_in_process(net, "averaging", {"averaging_frequency": 2, "save_updater": True}, [a, b])``.
    """
    task = WorkerTask(
        mode, dict(settings), NetworkBlueprint.of(net).to_bytes(), epochs=epochs, prefetch=prefetch, **task_options
    )
    results = InProcessRunner(timeout_s).run(task, [ItemSource(shard) for shard in shards])
    if merge:
        merge_results(net, results)
    return results


# ------------------------------------------------------------------ replicas
class HoldsResults(Protocol):
    """SparkNetwork and ParallelWrapper: the workers' results of the last fit."""

    last_results: list[WorkerResult]


#: where a fit's per-rank checksums can be read: the workers' results, anything holding them as ``last_results``,
#: the fit's :class:`TrainingStats` or its summary dict (``param_checksums``), or the replicas themselves
ChecksumSource = Sequence[WorkerResult] | Sequence[Network] | HoldsResults | TrainingStats | Mapping[str, Any]


def rank_checksums(source: ChecksumSource) -> dict[int, str | None]:
    """Every rank's measured parameter checksum (:func:`~torchspark.training.task.param_checksum` of its replica
    at the end of the fit), by rank.

    Args:
        source: a sequence of :class:`~torchspark.training.WorkerResult`; an object with ``last_results``
            (``SparkNetwork``, ``ParallelWrapper``); a :class:`~torchspark.stats.TrainingStats`; a training stats
            summary dict (its ``param_checksums``, absent when the route keeps no replicas); or the replicas
            themselves, a sequence of Networks in rank order (tests that drive an algorithm's loop directly).

    Example: ``rank_checksums(wrapper)`` -> ``{0: "3fa1...", 1: "3fa1..."}``.
    """
    if isinstance(source, TrainingStats):
        source = source.summary()
    if isinstance(source, Mapping):
        return {int(rank): checksum for rank, checksum in source.get("param_checksums", {}).items()}
    items = list(getattr(source, "last_results", source))
    if all(isinstance(item, Network) for item in items):
        return {rank: param_checksum(replica) for rank, replica in enumerate(items)}
    return {r.rank: r.param_checksum for r in items}


def assert_replicas_identical(source: ChecksumSource, workers: int, *, net: Network | None = None) -> str:
    """Assert that ranks ``0 .. workers-1`` each measured a checksum and all measured the same one (their replicas
    ended bit-identical), and with ``net`` that the driver's network holds that very replica.

    Args:
        source: where the checksums are read (see :func:`rank_checksums`).
        workers: how many ranks the fit ran.
        net: the driver's network after the fit (None: not checked).

    Returns:
        The common checksum.

    Example: ``assert_replicas_identical(spark_net, 2, net=net)`` after ``spark_net.fit(...)``.
    """
    checksums = rank_checksums(source)
    assert sorted(checksums) == list(range(workers)), f"checksums of ranks {sorted(checksums)}, not of {workers}"
    assert None not in checksums.values() and len(set(checksums.values())) == 1, checksums
    common = checksums[0]
    assert common is not None
    if net is not None:
        assert param_checksum(net) == common, (param_checksum(net), common)
    return common


def averaging_only(mode: str, averaging_frequency: int) -> dict[str, int]:
    """``{"averaging_frequency": n}`` for ``ParallelWrapper(training_mode="averaging", ...)``, nothing for
    ``"sharing"`` (whose master has no such option: passing it is a ConfigError)."""
    return {"averaging_frequency": averaging_frequency} if mode == "averaging" else {}
