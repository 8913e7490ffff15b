"""Safetensors batch files on local paths and fsspec URLs: round trips, atomic writes, corrupt files."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import safetensors.torch
import torch
from fsspec.implementations.memory import MemoryFileSystem
from torch.testing import assert_close

from torchspark.data import (
    DataSet,
    MultiDataSet,
    dataset_from_bytes,
    dataset_to_bytes,
    list_batches,
    load_batch,
    rebatch,
    save_batch,
    save_batches,
)
from torchspark.errors import DataError


def make(n: int = 6, offset: int = 0) -> DataSet:
    idx = torch.arange(offset, offset + n)
    return DataSet(idx.float().reshape(n, 1, 1).repeat(1, 2, 3), idx % 4, torch.ones(n, 2), (idx % 2).float())


def assert_same(a: DataSet | MultiDataSet, b: DataSet | MultiDataSet) -> None:
    assert type(a) is type(b)
    assert a._named().keys() == b._named().keys()
    for name, tensor in a._named().items():
        assert_close(b._named()[name], tensor, rtol=0, atol=0)
        assert b._named()[name].dtype == tensor.dtype


@pytest.fixture
def memdir() -> Iterator[str]:
    """A fresh memory:// directory, removed afterwards (the memory filesystem is process-global)."""
    path = f"memory://ts-test-{uuid.uuid4().hex}"
    yield path
    fs = fsspec.filesystem("memory")
    if fs.exists(path):
        fs.rm(path, recursive=True)


class FailingMoveFS(MemoryFileSystem):
    """A memory filesystem whose rename fails, to test cleanup after the temp file was written."""

    protocol = "failmv"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol("memory://" + path.removeprefix("failmv://"))

    def mv(self, path1: str, path2: str, **kwargs: object) -> None:
        raise PermissionError(f"rename refused: {path2}")


fsspec.register_implementation("failmv", FailingMoveFS, clobber=True)


# --- bytes ----------------------------------------------------------------------------------------------------


def test_bytes_round_trip_dataset_and_metadata() -> None:
    ds = make()
    data = dataset_to_bytes(ds)
    assert_same(ds, dataset_from_bytes(data))
    header_len = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + header_len])["__metadata__"]
    assert meta == {"format": "torchspark.batch", "version": "1", "kind": "DataSet", "num_examples": "6"}
    assert set(safetensors.torch.load(data)) == {"features", "labels", "features_mask", "labels_mask"}


def test_bytes_round_trip_multi_unlabelled_and_partial_masks() -> None:
    m = MultiDataSet([torch.randn(4, 3), torch.randint(0, 9, (4, 5))], [torch.eye(4)], [None, torch.ones(4, 5)], None)
    back = dataset_from_bytes(dataset_to_bytes(m))
    assert_same(m, back)
    assert isinstance(back, MultiDataSet) and back.features_masks is not None and back.features_masks[0] is None
    assert set(safetensors.torch.load(dataset_to_bytes(m))) == {
        "features.0",
        "features.1",
        "labels.0",
        "features_mask.1",
    }
    unlabelled = DataSet(torch.randn(3, 2))
    assert_same(unlabelled, dataset_from_bytes(dataset_to_bytes(unlabelled)))


def test_non_contiguous_and_shared_memory_tensors_are_saved() -> None:
    base = torch.randn(5, 4)
    ds = DataSet(base.t(), features_mask=base.t())  # non-contiguous, and both share one storage
    assert_same(ds, dataset_from_bytes(dataset_to_bytes(ds)))
    sliced = make(10).slice(3, 7)  # views into larger tensors
    assert_same(sliced, dataset_from_bytes(dataset_to_bytes(sliced)))


def test_unserializable_data_raises_data_error() -> None:
    sparse = DataSet(torch.eye(3).to_sparse())
    with pytest.raises(DataError, match="to_dense"):
        dataset_to_bytes(sparse)
    with pytest.raises(DataError, match="got Tensor"):
        dataset_to_bytes(torch.zeros(2))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "empty or truncated"),
        (b"\x01\x02", "empty or truncated"),
        (b"hello, this is a text file\n", "truncated or not a safetensors file"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00{{{{{", "not a safetensors file"),
        (safetensors.torch.save({"features": torch.zeros(2, 2)}), "not a torchspark batch file"),
        (
            safetensors.torch.save(
                {"features": torch.zeros(2, 2)},
                metadata={"format": "torchspark.batch", "version": "9", "kind": "DataSet"},
            ),
            "version '9'",
        ),
        (
            safetensors.torch.save(
                {"x": torch.zeros(2, 2)}, metadata={"format": "torchspark.batch", "version": "1", "kind": "DataSet"}
            ),
            "needs 'features'",
        ),
        (
            safetensors.torch.save(
                {"features": torch.zeros(2, 2)},
                metadata={"format": "torchspark.batch", "version": "1", "kind": "Other"},
            ),
            "unknown kind 'Other'",
        ),
    ],
    # named by the expected message: the bytes' own ids hold safetensors' metadata in a per-process order, and
    # pytest-xdist's workers must collect the same test ids
    ids=lambda value: value if isinstance(value, str) else "bytes",
)
def test_foreign_bytes_name_the_source(data: bytes, fragment: str) -> None:
    with pytest.raises(DataError, match=fragment) as info:
        dataset_from_bytes(data, source="s3://bucket/part-7.safetensors")
    assert "s3://bucket/part-7.safetensors" in str(info.value)


def test_truncated_bytes_at_every_cut_raise_data_error() -> None:
    data = dataset_to_bytes(make(3))
    for cut in range(0, len(data), 7):
        with pytest.raises(DataError, match="x.safetensors"):
            dataset_from_bytes(data[:cut], source="x.safetensors")


# --- files ----------------------------------------------------------------------------------------------------


def test_local_round_trip_names_and_listing(tmp_path: Path) -> None:
    directory = str(tmp_path / "new" / "batches")  # created on demand
    batches = make(10).split(4)
    paths = save_batches(batches, directory)
    assert paths == [os.path.join(directory, f"batch_{i:06d}.safetensors") for i in range(3)]
    (tmp_path / "new" / "batches" / "notes.txt").write_text("not a batch")
    assert list_batches(directory) == paths
    for path, expected in zip(paths, batches):
        assert_same(expected, load_batch(path))
    # file:// URLs work too and keep the caller's spelling
    url = f"file://{directory}"
    assert list_batches(url) == [f"{url}/batch_{i:06d}.safetensors" for i in range(3)]
    assert_same(batches[1], load_batch(f"{url}/batch_000001.safetensors"))


def test_memory_round_trip_with_rebatch_and_prefix(memdir: str) -> None:
    stream = [make(5), make(9, offset=5), make(2, offset=14)]
    paths = save_batches(rebatch(iter(stream), 4), memdir, prefix="part-00003")
    assert paths == [f"{memdir}/part-00003_{i:06d}.safetensors" for i in range(4)]
    assert list_batches(memdir) == paths
    loaded = [load_batch(p) for p in paths]
    assert [len(b) for b in loaded] == [4, 4, 4, 4]
    assert_same(DataSet.merge(stream), DataSet.merge(loaded))  # type: ignore[arg-type]


def test_save_batch_overwrites_and_returns_path(memdir: str) -> None:
    path = f"{memdir}/one.safetensors"
    assert save_batch(make(2), path) == path
    assert save_batch(make(3), path) == path
    assert len(load_batch(path)) == 3
    assert fsspec.filesystem("memory").ls(memdir, detail=False) == [
        memdir.removeprefix("memory:/") + "/one.safetensors"
    ]


def test_unwritable_directory_raises_and_leaves_no_temp_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a regular file, so nothing can be created below it")
    with pytest.raises(DataError, match=str(blocker / "sub")):
        save_batches([make(2)], str(blocker / "sub"))
    with pytest.raises(DataError, match=str(blocker)):
        save_batch(make(2), str(blocker / "x.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_failed_rename_removes_the_temp_file() -> None:
    directory = f"failmv://ts-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("failmv")
    with pytest.raises(DataError, match="cannot write batch file .*b.safetensors.*rename refused"):
        save_batch(make(2), f"{directory}/b.safetensors")
    assert fs.ls(directory, detail=False) == []
    fs.rm(directory, recursive=True)


def test_failed_serialization_writes_nothing(memdir: str) -> None:
    with pytest.raises(DataError):
        save_batches([make(2), DataSet(torch.eye(2).to_sparse())], memdir)
    assert list_batches(memdir) == [f"{memdir}/batch_000000.safetensors"]
    assert fsspec.filesystem("memory").ls(memdir, detail=False) == [
        memdir.removeprefix("memory:/") + "/batch_000000.safetensors"
    ]


def test_save_batches_validates_items_and_prefix(memdir: str) -> None:
    with pytest.raises(DataError, match="item 1 is a Tensor"):
        save_batches([make(2), torch.zeros(2)], memdir)  # type: ignore[list-item]
    for prefix in ["", "a/b", ".hidden"]:
        with pytest.raises(DataError, match="prefix"):
            save_batches([make(2)], memdir, prefix=prefix)


def test_save_batches_into_a_directory_with_an_earlier_export_is_refused(tmp_path: Path, memdir: str) -> None:
    directory = str(tmp_path / "batches")
    first = save_batches(make(9).split(4), directory)
    (tmp_path / "batches" / "notes.txt").write_text("not a batch")
    for prefix in ("batch", "other"):  # same names or not: both exports would be listed and trained on
        with pytest.raises(
            DataError,
            match=r"save_batches: '.*batches' already holds 3 batch file\(s\) \(e.g. 'batch_000000.safetensors'\)"
            r".*earlier export.*Export into an empty \(or new\) directory, or delete the old files first",
        ):
            save_batches(make(3, offset=50).split(2), directory, prefix=prefix)
    assert list_batches(directory) == first  # nothing replaced or added
    assert [len(load_batch(p)) for p in first] == [4, 4, 1]
    # only batch files count: other files and a hidden temp file of a crashed write do not
    other = tmp_path / "other"
    other.mkdir()
    (other / "readme.txt").write_text("x")
    (other / ".rest-1a2b_000000.safetensors").write_bytes(b"")
    assert len(save_batches([make(2)], str(other))) == 1
    save_batches([make(2)], memdir)
    with pytest.raises(DataError, match="already holds 1 batch file"):  # any fsspec filesystem
        save_batches([make(2)], memdir)


def test_save_onto_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(DataError, match="a directory has that name"):
        save_batch(make(2), str(tmp_path / "d.safetensors"))


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.safetensors")
    with pytest.raises(DataError, match=f"batch file not found: {missing}"):
        load_batch(missing)
    good = save_batch(make(4), str(tmp_path / "good.safetensors"))
    data = Path(good).read_bytes()
    for name, content in [
        ("cut.safetensors", data[: len(data) // 2]),
        ("empty.safetensors", b""),
        ("text.safetensors", b"just some text that is long enough\n"),
    ]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(DataError, match=str(bad)):
            load_batch(str(bad))
    with pytest.raises(DataError, match=str(tmp_path)):
        load_batch(str(tmp_path))  # a directory


def test_list_batches_missing_directory(tmp_path: Path, memdir: str) -> None:
    with pytest.raises(DataError, match="batch directory not found"):
        list_batches(str(tmp_path / "nope"))
    with pytest.raises(DataError, match=memdir):
        list_batches(memdir)


def test_list_batches_skips_temp_files(tmp_path: Path) -> None:
    save_batch(make(2), str(tmp_path / "batch_000000.safetensors"))
    (tmp_path / ".batch_000001.safetensors.tmp-abc").write_bytes(b"partial")
    (tmp_path / ".hidden.safetensors").write_bytes(b"x")
    assert list_batches(str(tmp_path)) == [str(tmp_path / "batch_000000.safetensors")]
