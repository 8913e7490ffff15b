"""The exact balanced plan (:mod:`torchspark.training.assignment`) against a few-line reference, its export-file
form, and where exports go (:func:`torchspark.spark.export.export_base`); no Spark session needed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from helpers import parts_of_sizes
from torchspark import DataSet
from torchspark.data import recut, save_batch
from torchspark.errors import ConfigError, DataError
from torchspark.spark.export import export_base
from torchspark.training.assignment import FileSlices, file_items, grid_heads, plan_balanced, split_examples
from torchspark.training.worker.loop import load_item

SIZES = [[37, 5, 100, 1], [100], [0, 3, 0, 0, 2], [1, 1, 1], [16, 16], [7, 0, 9]]


def _reference(total: int, batch: int, workers: int, seed: int | None) -> list[list[list[int]]]:
    """Per worker, its minibatches as lists of global example indices: the module docstring's steps, literally."""
    grid = [list(range(start, min(start + batch, total))) for start in range(0, total, batch)]
    full = total // batch
    order = list(range(len(grid)))
    if seed is not None:
        order[:full] = np.random.default_rng(seed).permutation(full).tolist()
    sequence = [(slot, example) for slot, g in enumerate(order) for example in grid[g]]
    out = []
    for w in range(workers):
        mine = sequence[w * total // workers : (w + 1) * total // workers]
        groups = [[e for _, e in group] for _, group in itertools.groupby(mine, key=lambda t: t[0])]
        if batch > 1:  # step 5: a 1-example minibatch joins its neighbour (the previous one, else the next one)
            for k in range(len(groups)):
                if len(groups[k]) == 1 and k > 0:
                    groups[k - 1] += groups[k]
                    groups[k] = []
                elif len(groups[k]) == 1 and k + 1 < len(groups):
                    groups[k + 1] = groups[k] + groups[k + 1]
                    groups[k] = []
            groups = [sorted(g) for g in groups if g]  # a merged minibatch's examples in data order
        out.append(groups)
    return out


def _global(plan, sizes: list[int]) -> list[list[list[int]]]:
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [
        [
            [int(offsets[plan.partition[r]]) + i for r in rows for i in range(plan.start[r], plan.stop[r])]
            for rows in plan.minibatches(w)
        ]
        for w in range(plan.num_workers)
    ]


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("batch", [8, 3])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [None, 0, 7])
def test_balanced_plan_matches_the_reference(sizes: list[int], batch: int, workers: int, seed) -> None:
    total = sum(sizes)
    plan = plan_balanced(sizes, batch, workers, seed)
    assert _global(plan, sizes) == _reference(total, batch, workers, seed)
    counts = plan.examples_per_worker()
    assert sum(counts) == total and set(counts) <= {total // workers, -(-total // workers)}
    for w in range(workers):  # full minibatches except a short first and a short last one
        lengths = [int((plan.stop[rows] - plan.start[rows]).sum()) for rows in plan.minibatches(w)]
        assert all(n == batch for n in lengths[1:-1]) and all(0 < n <= batch + 2 for n in lengths), lengths
        assert batch == 1 or len(lengths) == 1 or 1 not in lengths, lengths  # no avoidable 1-example minibatch
    for p, size in enumerate(sizes):  # every example of every partition exactly once
        rows = plan.partition_rows(p)
        assert plan.start[rows].tolist() == [0, *plan.stop[rows][:-1].tolist()][: len(rows)]
        assert (plan.stop[rows][-1] if len(rows) else 0) == size
    # partitioning only splits minibatches into pieces: one partition of all the data gives the same minibatches
    assert _global(plan_balanced([total], batch, workers, seed), [total]) == _global(plan, sizes)


def test_no_one_example_minibatch_from_the_split() -> None:
    """66 examples, 2 workers, batch 16 used to give worker 0 the minibatches 16, 16, 1 (BatchNorm fails on 1)."""
    plan = plan_balanced([66], 16, 2, None)
    lengths = [[int((plan.stop[r] - plan.start[r]).sum()) for r in plan.minibatches(w)] for w in range(2)]
    assert lengths == [[16, 17], [15, 16, 2]]
    assert plan.examples_per_worker() == [33, 33]


@pytest.mark.parametrize("sizes", [[66], [30, 36], [37, 5, 100, 1], [16, 16]])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("seed", [None, 3])
def test_drop_last_trains_only_full_minibatches(sizes: list[int], workers: int, seed) -> None:
    total, batch = sum(sizes), 16
    plan = plan_balanced(sizes, batch, workers, seed, drop_last=True)
    lengths = [[int((plan.stop[r] - plan.start[r]).sum()) for r in plan.minibatches(w)] for w in range(workers)]
    assert all(n == batch for mine in lengths for n in mine), lengths
    counts = [len(mine) for mine in lengths]
    assert sum(counts) == total // batch and max(counts) - min(counts) <= 1
    globals_ = sorted(e for mine in _global(plan, sizes) for mb in mine for e in mb)
    assert len(set(globals_)) == len(globals_) == total // batch * batch
    # the same full minibatches as without drop_last: only the remainder goes
    kept = {tuple(mb) for mine in _global(plan, sizes) for mb in mine}
    grid = {tuple(range(g * batch, (g + 1) * batch)) for g in range(total // batch)}
    assert kept == grid
    assert (
        plan_balanced(sizes, batch, workers, seed, drop_last=False).examples_per_worker() != plan.examples_per_worker()
        or total % batch == 0
    )


def test_drop_last_refuses_data_smaller_than_a_batch() -> None:
    with pytest.raises(DataError, match=r"holds 5 examples.*batch_size=8.*drop_last=False"):
        plan_balanced([5], 8, 2, None, drop_last=True)


def test_seeded_plans_are_deterministic_and_seeds_differ() -> None:
    sizes = [37, 5, 100, 1]
    first, again = (_global(plan_balanced(sizes, 8, 3, 11), sizes) for _ in range(2))
    assert first == again
    assert _global(plan_balanced(sizes, 8, 3, 12), sizes) != first
    assert _global(plan_balanced(sizes, 8, 3, None), sizes) != first


@pytest.mark.parametrize(
    ("sizes", "batch", "workers", "error"),
    [
        ([0, 0], 8, 2, DataError),
        ([], 8, 2, DataError),
        ([5, -1], 8, 2, DataError),
        ([5], 0, 2, ConfigError),
        ([5], 8, 0, ConfigError),
    ],
)
def test_balanced_plan_refuses_bad_input(sizes, batch, workers, error) -> None:
    with pytest.raises(error):
        plan_balanced(sizes, batch, workers, None)


def test_grid_heads_cut_files_on_the_global_grid() -> None:
    assert grid_heads([37, 5, 100, 1], 8) == [0, 3, 6, 2]  # offsets 0, 37, 42, 142
    assert grid_heads([16, 0, 8], 8) == [0, 0, 0]


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("seed", [None, 4])
def test_export_items_load_the_same_minibatches_as_in_memory_data(tmp_path, workers: int, seed) -> None:
    """The export route's files + items give what ParallelWrapper slices from memory (Spark's direct route is
    compared with both in tests/spark/test_balanced_spark.py)."""
    sizes = [37, 5, 100, 1]
    parts = parts_of_sizes(sizes, n_features=4, seed=1)
    files = []  # what export_rdd writes: each partition cut at its grid head, then every batch
    for p, (part, head) in enumerate(zip(parts, grid_heads(sizes, 8))):
        cuts = itertools.chain([head] if head else [], itertools.repeat(8))
        for i, piece in enumerate(recut(part.split(10), cuts)):
            files.append((p, save_batch(piece, str(tmp_path / f"p{p}_{i}.safetensors")), len(piece)))
    items = file_items(plan_balanced(sizes, 8, workers, seed), files)
    expected = split_examples(parts, 8, workers, seed)
    assert [len(mine) for mine in items] == [len(mine) for mine in expected]
    for mine, theirs in zip(items, expected):
        for item, batch in zip(mine, theirs):
            loaded = load_item(item)
            torch.testing.assert_close(loaded.features, batch.features, atol=0, rtol=0)
            torch.testing.assert_close(loaded.labels, batch.labels, atol=0, rtol=0)
    kinds = [type(item) for mine in items for item in mine]
    assert kinds.count(str) > kinds.count(FileSlices)  # most minibatches are whole files
    with pytest.raises(DataError, match="counted"):
        file_items(plan_balanced([s + 1 for s in sizes], 8, workers, seed), files)


@pytest.mark.parametrize(
    ("export_directory", "master", "local_dir", "expected"),
    [
        (None, "local[2]", None, "/tmp"),  # a private torchspark-export-* directory is made there
        (None, "local", "/data/spark", "/data/spark"),
        (None, "local-cluster[2,1,1024]", "/fast/a, /fast/b", "/fast/a"),
        (None, "local[*]", "", "/tmp"),
        ("hdfs://nn/exports", "yarn", None, "hdfs://nn/exports"),
        ("/shared/mount", "spark://host:7077", "/local", "/shared/mount"),
    ],
)
def test_export_base(export_directory, master: str, local_dir, expected: str) -> None:
    assert export_base(export_directory, master, local_dir, "/tmp") == expected


@pytest.mark.parametrize("master", ["yarn", "spark://host:7077", "k8s://https://api:6443", "localhost:7077"])
def test_export_base_refuses_a_cluster_without_export_directory(master: str) -> None:
    with pytest.raises(ConfigError, match=r"export_directory.*(hdfs://|s3://).*rdd_training_approach='direct'"):
        export_base(None, master, "/local", "/tmp")


def test_plan_files_rebatches_user_files_of_any_size(tmp_path) -> None:
    """DL4J re-batches exported data to batch_size_per_worker: files of 5, 20, 2, 18 and 0 examples become
    minibatches of 8 (short only where a worker's share starts or ends), the data order kept."""
    from torchspark.data import batch_num_examples, save_batches
    from torchspark.training.assignment import plan_files

    features = torch.arange(45, dtype=torch.float32).reshape(45, 1)
    data = DataSet(features, torch.zeros(45, dtype=torch.long))
    cuts = [0, 5, 25, 27, 45, 45]
    paths = save_batches([data.slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])], str(tmp_path))
    assert [batch_num_examples(p) for p in paths] == [5, 20, 2, 18, 0]
    groups = plan_files([(p, batch_num_examples(p)) for p in paths], 8, 2, None)
    loaded = [[load_item(item) for item in worker] for worker in groups]
    assert [[len(b) for b in worker] for worker in loaded] == [[8, 8, 6], [2, 8, 8, 5]]
    order = torch.cat([b.features for worker in loaded for b in worker]).reshape(-1)
    assert torch.equal(order, features.reshape(-1))  # every example once, in data order
    seeded = plan_files([(p, batch_num_examples(p)) for p in paths], 8, 2, 3)
    seeded_order = torch.cat([load_item(i).features for worker in seeded for i in worker]).reshape(-1)
    assert sorted(seeded_order.tolist()) == features.reshape(-1).tolist() and not torch.equal(seeded_order, order)
