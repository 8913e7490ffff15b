"""DataSet, MultiDataSet, iterate_minibatches and rebatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from torchspark.data import DataSet, MultiDataSet, iterate_minibatches, rebatch, recut
from torchspark.errors import DataError


def make(n: int = 10, offset: int = 0, masks: bool = False) -> DataSet:
    """Example i has features [i, i, i] and label i % 3, so order and content are easy to check."""
    idx = torch.arange(offset, offset + n)
    features = idx.float().unsqueeze(1).repeat(1, 3)  # (n, 3)
    labels = idx % 3
    if masks:
        return DataSet(features, labels, torch.ones(n, 3), (idx % 2).float())
    return DataSet(features, labels)


def make_multi(n: int = 10, offset: int = 0) -> MultiDataSet:
    idx = torch.arange(offset, offset + n)
    return MultiDataSet(
        [idx.float().unsqueeze(1), idx.float().reshape(n, 1, 1).repeat(1, 2, 2)],
        [idx % 2, torch.nn.functional.one_hot(idx % 4, 4).float()],
    )


def ids(ds: DataSet | MultiDataSet) -> list[int]:
    features = ds.features if isinstance(ds, DataSet) else ds.features[0]
    return [int(v) for v in features[:, 0]]


# --- DataSet construction -------------------------------------------------------------------------------------


def test_accepts_numpy_and_converts_int_labels_to_int64() -> None:
    ds = DataSet(np.zeros((4, 2), dtype=np.float32), np.array([0, 1, 2, 1], dtype=np.int32))
    assert isinstance(ds.features, torch.Tensor) and ds.features.shape == (4, 2)
    assert ds.labels is not None and ds.labels.dtype == torch.int64
    assert ds.num_examples() == len(ds) == 4
    assert ds.features_mask is None and ds.labels_mask is None


def test_accepts_one_hot_float_labels_and_unlabelled() -> None:
    ds = DataSet(torch.zeros(3, 2), torch.eye(3))
    assert ds.labels is not None and ds.labels.dtype == torch.float32 and ds.labels.shape == (3, 3)
    assert DataSet(torch.zeros(3, 2)).labels is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"labels": torch.zeros(4, dtype=torch.int64)}, "labels has 4 examples but features has 5"),
        ({"features_mask": torch.ones(3, 2)}, "features_mask has 3 examples but features has 5"),
        (
            {"labels": torch.zeros(5, dtype=torch.int64), "labels_mask": torch.ones(6)},
            "labels_mask has 6 examples but features has 5",
        ),
        ({"labels_mask": torch.ones(5)}, "labels_mask was given without labels"),
        ({"labels": torch.zeros(5)}, "1-D with float dtype"),
        ({"labels": torch.tensor(1)}, "labels is a scalar"),
    ],
)
def test_construction_errors_name_the_array(kwargs: dict, fragment: str) -> None:
    with pytest.raises(DataError, match=fragment):
        DataSet(torch.zeros(5, 2), **kwargs)


def test_zero_dim_and_unconvertible_features_are_refused() -> None:
    with pytest.raises(DataError, match="features is a scalar"):
        DataSet(torch.tensor(3.0))
    with pytest.raises(DataError, match="features must be a torch tensor"):
        DataSet("not an array")


# --- DataSet methods ------------------------------------------------------------------------------------------


def test_split_sizes_and_content() -> None:
    parts = make(10, masks=True).split(4)
    assert [len(p) for p in parts] == [4, 4, 2]
    assert sum((ids(p) for p in parts), []) == list(range(10))
    assert parts[2].labels_mask is not None and parts[2].labels_mask.tolist() == [0.0, 1.0]
    assert DataSet(torch.zeros(0, 3)).split(4) == []


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True, None])
def test_split_rejects_bad_batch_size(bad: object) -> None:
    with pytest.raises(DataError, match="batch_size"):
        make().split(bad)  # type: ignore[arg-type]


def test_slice_and_bounds() -> None:
    part = make(10).slice(3, 7)
    assert ids(part) == [3, 4, 5, 6] and part.labels is not None and part.labels.tolist() == [0, 1, 2, 0]
    assert len(make(10).slice(5, 5)) == 0
    for start, stop in [(-1, 3), (4, 2), (0, 11)]:
        with pytest.raises(DataError, match=rf"slice\({start}, {stop}\) is out of range for 10 examples"):
            make(10).slice(start, stop)


def test_merge_concatenates_in_order() -> None:
    merged = DataSet.merge([make(3), make(4, offset=3, masks=False), make(2, offset=7)])
    assert ids(merged) == list(range(9))
    assert merged.labels is not None and merged.labels.tolist() == [i % 3 for i in range(9)]
    with_masks = DataSet.merge([make(2, masks=True), make(3, offset=2, masks=True)])
    assert with_masks.features_mask is not None and with_masks.features_mask.shape == (5, 3)


def test_merge_errors_name_the_index() -> None:
    with pytest.raises(DataError, match="empty list"):
        DataSet.merge([])
    with pytest.raises(DataError, match="item 2 features is"):
        DataSet.merge([make(2), make(2), DataSet(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64))])
    with pytest.raises(DataError, match="item 1 has arrays"):
        DataSet.merge([make(2), DataSet(torch.zeros(2, 3))])
    with pytest.raises(DataError, match="item 1 is a MultiDataSet"):
        DataSet.merge([make(2), make_multi(2)])  # type: ignore[list-item]


def test_shuffle_is_a_deterministic_permutation() -> None:
    ds = make(20, masks=True)
    a, b, c = ds.shuffle(7), ds.shuffle(7), ds.shuffle(8)
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert sorted(ids(a)) == list(range(20)) and ids(a) != list(range(20))
    order = ids(a)
    # labels and masks travel with their example
    assert a.labels is not None and a.labels.tolist() == [i % 3 for i in order]
    assert a.labels_mask is not None and a.labels_mask.tolist() == [float(i % 2) for i in order]
    assert ids(ds) == list(range(20))  # the original is untouched


def test_to_device_returns_new_dataset() -> None:
    ds = make(4, masks=True)
    moved = ds.to("cpu")
    assert moved is not ds
    assert_close(moved.features, ds.features)
    assert moved.features_mask is not None and moved.features_mask.device.type == "cpu"
    assert make(4).to(torch.device("meta")).features.device.type == "meta"


def test_check_finite_names_tensor_and_first_bad_example() -> None:
    make(5, masks=True).check_finite()
    features = torch.zeros(6, 2)
    features[4, 1] = float("nan")
    features[5, 0] = float("inf")
    with pytest.raises(DataError, match=r"train: features contains NaN at example 4 .*2 of 6"):
        DataSet(features).check_finite("train")
    labels = torch.zeros(3, 2)
    labels[1, 0] = float("-inf")
    with pytest.raises(DataError, match="data: labels contains Inf at example 1"):
        DataSet(torch.zeros(3, 2), labels).check_finite()


def test_repr_shows_shapes() -> None:
    text = repr(make(4, masks=True))
    assert "n=4" in text and "features=(4, 3) float32" in text and "labels=(4,) int64" in text


# --- MultiDataSet ---------------------------------------------------------------------------------------------


def test_multi_construction_and_to_multi() -> None:
    m = make(5, masks=True).to_multi()
    assert isinstance(m, MultiDataSet) and len(m) == 5
    assert m.labels is not None and m.labels[0].dtype == torch.int64
    assert m.features_masks is not None and m.labels_masks is not None
    unlabelled = DataSet(torch.zeros(2, 1)).to_multi()
    assert unlabelled.labels is None and unlabelled.features_masks is None
    assert MultiDataSet([torch.zeros(2, 1)], [], [None]).labels is None  # empty lists normalise to None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (([],), "empty list"),
        ((torch.zeros(3, 1),), "must be a list"),
        (([torch.zeros(3, 1), torch.zeros(4, 1)],), r"features.1 has 4 examples but features.0 has 3"),
        (([torch.zeros(3, 1)], [torch.zeros(2, dtype=torch.int64)]), r"labels.0 has 2 examples"),
        (([torch.zeros(3, 1)], None, [None, None]), "features_masks has 2 entries"),
        (([torch.zeros(3, 1)], None, None, [torch.ones(3)]), "labels_masks was given without labels"),
        (([torch.zeros(3, 1)], None, [torch.ones(2, 5)]), r"features_mask.0 has 2 examples"),
    ],
)
def test_multi_construction_errors(args: tuple, fragment: str) -> None:
    with pytest.raises(DataError, match=fragment):
        MultiDataSet(*args)


def test_multi_methods() -> None:
    m = make_multi(10)
    assert [len(p) for p in m.split(3)] == [3, 3, 3, 1]
    assert ids(m.slice(2, 5)) == [2, 3, 4]
    shuffled = m.shuffle(1)
    assert sorted(ids(shuffled)) == list(range(10)) and ids(shuffled) == ids(m.shuffle(1))
    assert shuffled.labels is not None and shuffled.labels[0].tolist() == [i % 2 for i in ids(shuffled)]
    assert_close(shuffled.features[1][:, 0, 0], shuffled.features[0][:, 0])
    merged = MultiDataSet.merge(m.split(4))
    assert ids(merged) == list(range(10))
    assert merged.to("cpu").features[1].shape == (10, 2, 2)
    assert "features=[(10, 1) float32, (10, 2, 2) float32]" in repr(m)
    with pytest.raises(DataError, match="item 1 has arrays"):
        MultiDataSet.merge([m, MultiDataSet(m.features)])
    bad = torch.zeros(10, 1)
    bad[3] = float("nan")
    with pytest.raises(DataError, match=r"x: features.1 contains NaN at example 3"):
        MultiDataSet([torch.zeros(10, 1), bad]).check_finite("x")


# --- iterate_minibatches / rebatch ----------------------------------------------------------------------------


def test_iterate_minibatches_splits_a_dataset_and_passes_iterables_through() -> None:
    assert [len(b) for b in iterate_minibatches(make(10), 4)] == [4, 4, 2]
    assert [len(b) for b in iterate_minibatches(make_multi(5), 2)] == [2, 2, 1]
    stream = [make(3), make(7)]
    assert [len(b) for b in iterate_minibatches(iter(stream), 4)] == [3, 7]


def test_iterate_minibatches_errors() -> None:
    with pytest.raises(DataError, match="item 1 of the stream is a Tensor"):
        list(iterate_minibatches([make(2), torch.zeros(2)], 4))
    with pytest.raises(DataError, match="got int"):
        list(iterate_minibatches(5, 4))  # type: ignore[arg-type]
    with pytest.raises(DataError, match="batch_size"):
        list(iterate_minibatches(make(2), 0))


@pytest.mark.parametrize("sizes", [[10], [3, 3, 3, 3], [1, 17, 2], [0, 5, 0, 8], [4, 4]])
@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_rebatch_exact_sizes_and_order(sizes: list[int], batch_size: int) -> None:
    stream, offset = [], 0
    for n in sizes:
        stream.append(make(n, offset=offset, masks=True))
        offset += n
    out = list(rebatch(iter(stream), batch_size))
    total = sum(sizes)
    assert [len(b) for b in out[:-1]] == [batch_size] * (len(out) - 1)
    assert 0 < len(out[-1]) <= batch_size
    assert len(out) == -(-total // batch_size)
    merged = DataSet.merge(out)
    expected = make(total, masks=True)
    for name in ("features", "labels", "features_mask", "labels_mask"):
        assert_close(getattr(merged, name), getattr(expected, name))


def test_rebatch_multi_and_empty_and_errors() -> None:
    out = list(rebatch([make_multi(3), make_multi(4, offset=3)], 5))
    assert [len(b) for b in out] == [5, 2] and ids(out[0]) + ids(out[1]) == list(range(7))
    assert list(rebatch([], 3)) == []
    with pytest.raises(DataError, match="item 1 of the stream is a str"):
        list(rebatch([make(2), "x"], 3))
    with pytest.raises(DataError, match="item 1 of the stream is a MultiDataSet but earlier items are DataSets"):
        list(rebatch([make(2), make_multi(2)], 3))
    with pytest.raises(DataError, match="batch_size"):
        list(rebatch([make(2)], -2))


def test_recut_cuts_given_sizes_in_order() -> None:
    stream = [make(5), make(1, offset=5), make(10, offset=6)]
    out = list(recut(stream, [3, 1, 8, 2]))
    assert [len(b) for b in out] == [3, 1, 8, 2] and [i for b in out for i in ids(b)] == list(range(14))
    assert [len(b) for b in recut(stream, [4, 100])] == [4, 12]  # the stream ends inside a piece: it is short
    assert [len(b) for b in recut(stream, [4])] == [4]  # sizes run out: the rest is dropped (callers check)
    with pytest.raises(DataError, match="piece sizes must be ints >= 1"):
        list(recut(stream, [2, 0]))


def test_rebatch_tail_does_not_keep_the_large_input_alive() -> None:
    big = make(1000)
    out = rebatch([big], 300)
    batches = list(out)
    tail = batches[-1]
    assert len(tail) == 100
    # the incomplete tail is a copy, not a view into the 1000-example tensor
    assert tail.features.untyped_storage().nbytes() == 100 * 3 * 4


def test_datasets_pickle_for_spark() -> None:
    import pickle

    for original in (make(4, masks=True), make_multi(4)):
        restored = pickle.loads(pickle.dumps(original))
        assert type(restored) is type(original) and len(restored) == 4 and ids(restored) == ids(original)
