"""DataSets ship at their own size: pickling a view never drags the base storage along (issue: ``split`` parts
pickled the whole dataset)."""

from __future__ import annotations

import pickle

import torch

from torchspark.data import DataSet, MultiDataSet, dataset_to_bytes


def _own_bytes(ds: DataSet | MultiDataSet) -> int:
    return sum(t.numel() * t.element_size() for t in ds._named().values())


def test_every_split_part_pickles_at_its_own_size() -> None:
    big = DataSet(torch.randn(6000, 1, 8, 8), torch.randint(0, 10, (6000,)))
    parts = big.split(128)  # 32 KB parts of a 1.6 MB dataset (the last one holds 112 examples)
    for part in parts:
        size = len(pickle.dumps(part))
        assert _own_bytes(part) <= size <= _own_bytes(part) * 1.05, (size, _own_bytes(part))
    back = pickle.loads(pickle.dumps(parts[3]))
    torch.testing.assert_close(back.features, big.features[384:512])
    assert torch.equal(back.labels, big.labels[384:512])


def test_slice_and_shuffle_results_are_compact_and_exact() -> None:
    big = DataSet(torch.randn(5000, 20), torch.randn(5000, 3), torch.ones(5000, 20), torch.ones(5000, 3))
    for small in (big.slice(100, 150), big.shuffle(1).slice(0, 50)):
        assert len(pickle.dumps(small)) <= _own_bytes(small) * 1.05 + 2048
        back = pickle.loads(pickle.dumps(small))
        for name, tensor in small._named().items():
            assert torch.equal(back._named()[name], tensor)


def test_multidataset_views_pickle_compactly_and_keep_masks() -> None:
    n = 4000
    multi = MultiDataSet(
        [torch.randn(n, 5), torch.randn(n, 2, 3)],
        [torch.randint(0, 3, (n,)), torch.randn(n, 4)],
        [None, torch.ones(n, 2)],
        [torch.ones(n), None],
    )
    part = multi.split(32)[7]
    assert len(pickle.dumps(part)) <= _own_bytes(part) * 1.05 + 2048
    back = pickle.loads(pickle.dumps(part))
    assert isinstance(back, MultiDataSet)
    assert back.features_masks is not None and back.features_masks[0] is None
    assert back.labels_masks is not None and back.labels_masks[1] is None
    torch.testing.assert_close(back.features[1], multi.features[1][224:256])


def test_dataset_to_bytes_writes_only_the_view() -> None:
    big = DataSet(torch.randn(10000, 10), torch.randint(0, 2, (10000,)))
    part = big.slice(500, 600)
    assert len(dataset_to_bytes(part)) <= _own_bytes(part) + 1024


def test_non_contiguous_views_pickle_compactly() -> None:
    base = torch.randn(3000, 40)
    ds = DataSet(base[:, ::2], torch.zeros(3000, dtype=torch.int64))  # strided view of half the columns
    part = ds.slice(0, 10)
    assert len(pickle.dumps(part)) <= _own_bytes(part) * 1.05 + 2048
    assert torch.equal(pickle.loads(pickle.dumps(part)).features, base[:10, ::2])
