"""Preprocess once (``export_batches``), then train and evaluate from a directory, a glob, a list or an RDD of
paths on any fsspec URL; clear errors for empty or missing locations."""

from __future__ import annotations

import gc
import glob
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import mlp_net
from torchspark import Network, models, optim
from torchspark.data import DataSet, MultiDataSet, load_batch, save_batches
from torchspark.errors import ConfigError, DataError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, export_batches
from torchspark.training.driver.runner import InProcessRunner

BATCH = 4


def _ids_dataset(start: int, n: int) -> DataSet:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return DataSet(torch.stack([ids, ids * 0.5 - 3.0], dim=1), (torch.arange(start, start + n) % 3))


def _loaded_ids(paths: list[str]) -> list[int]:
    return sorted(int(v) for p in paths for v in load_batch(p).features[:, 0].tolist())


def test_export_batches_writes_exact_batches_and_merges_partition_remainders(sc, tmp_path) -> None:
    # partitions of 10, 7 and 13 examples (in items of uneven sizes): remainders 2, 3 and 1 are merged
    parts = [
        [_ids_dataset(0, 6), _ids_dataset(6, 4)],
        [_ids_dataset(10, 7)],
        [_ids_dataset(17, 1), _ids_dataset(18, 12)],
    ]
    rdd = sc.parallelize(parts, 3).flatMap(lambda items: items)
    assert rdd.getNumPartitions() == 3
    paths = export_batches(rdd, str(tmp_path / "out"), BATCH)
    sizes = [len(load_batch(p)) for p in paths]
    assert sizes == [BATCH] * 7 + [2]  # 30 examples: only the last file is short
    assert _loaded_ids(paths) == list(range(30))
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".")]  # no rest or temp files left


def test_export_batches_from_raw_records_with_a_function(sc, tmp_path) -> None:
    lines = [f"{i},{i * 2.0},{i % 2}" for i in range(23)]

    def parse(line: str) -> DataSet:
        a, b, label = line.split(",")
        return DataSet(torch.tensor([[float(a), float(b)]]), torch.tensor([int(label)]))

    paths = export_batches(sc.parallelize(lines, 4), f"file://{tmp_path}/csv", 5, record_fn=parse)
    assert all(p.startswith("file://") for p in paths)
    assert [len(load_batch(p)) for p in paths] == [5, 5, 5, 5, 3]
    assert _loaded_ids(paths) == list(range(23))
    with pytest.raises(DataError, match="record_fn returned a str"):
        export_batches(sc.parallelize(lines, 2), str(tmp_path / "bad"), 5, record_fn=lambda line: line)
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1, got 0"):
        export_batches(sc.parallelize(lines, 2), str(tmp_path / "bad"), 0, record_fn=parse)


def test_export_batches_from_a_dataframe_with_several_feature_and_label_columns(spark, tmp_path) -> None:
    rows = [([float(i), 1.0], [float(i)] * 3, i % 2, [0.5 * i]) for i in range(11)]
    df = spark.createDataFrame(rows, "a array<float>, b array<float>, cls long, reg array<float>").repartition(3)
    paths = export_batches(
        df, str(tmp_path / "df"), 4, features_col=["a", "b"], label_col=["cls", "reg"], integer_labels=[True, False]
    )
    batches = [load_batch(p) for p in paths]
    assert [len(b) for b in batches] == [4, 4, 3]
    merged = MultiDataSet.merge(batches)
    assert len(merged.features) == 2 and len(merged.labels) == 2
    order = torch.argsort(merged.features[0][:, 0])
    torch.testing.assert_close(merged.features[1][order], torch.arange(11.0).unsqueeze(1).repeat(1, 3))
    assert merged.labels[0].dtype == torch.int64 and torch.equal(merged.labels[0][order], torch.arange(11) % 2)
    torch.testing.assert_close(merged.labels[1][order], 0.5 * torch.arange(11.0).unsqueeze(1))


_net = partial(mlp_net, 2, 8, 3, updater=optim.SGD(lr=0.05, momentum=0.9))


def _master(**kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, averaging_frequency=2, num_workers=2, rng_seed=3, **kw
    )


def test_fit_paths_and_evaluate_take_a_directory_a_glob_a_list_or_an_rdd(spark, sc, tmp_path) -> None:
    data = DataSet.merge([_ids_dataset(0, 37)])
    data = DataSet(data.features / 37.0, data.labels)
    directory = str(tmp_path / "batches")
    listed = save_batches(data.split(5), directory)  # files of 5: re-batched to 4
    params, evals = [], []
    for source in (
        directory,
        f"file://{directory}",
        f"{directory}/batch_*.safetensors",
        listed,
        sc.parallelize(listed, 1),
    ):
        net = _net()
        spark_net = SparkNetwork(spark, net, _master(), progress=False, runner=InProcessRunner())
        spark_net.fit_paths(source, epochs=2)
        params.append(net.params())
        if not hasattr(source, "getNumPartitions"):
            evals.append(spark_net.evaluate(source).accuracy())
    for p in params[1:]:
        torch.testing.assert_close(p, params[0], atol=0, rtol=0)
    assert not torch.equal(params[0], _net().params())
    assert len(set(evals)) == 1


def test_fit_paths_and_evaluate_say_what_is_wrong_with_a_location(spark, tmp_path) -> None:
    spark_net = SparkNetwork(spark, _net(), _master(), progress=False, runner=InProcessRunner())
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a batch")
    cases = [
        (str(tmp_path / "missing"), "does not exist: no such file or directory"),
        (str(tmp_path / "empty"), "holds no batch files"),
        (str(tmp_path / "notes"), "holds no batch files"),
        (str(tmp_path / "empty" / "*.safetensors"), "no files match"),
        ([], "the list of paths is empty"),
    ]
    for source, message in cases:
        with pytest.raises(DataError, match=message):
            spark_net.fit_paths(source)
        with pytest.raises(DataError, match=message):
            spark_net.evaluate(source)
    with pytest.raises(DataError, match="paths must be a directory, a glob, a file path, a list of paths or an RDD"):
        spark_net.fit_paths(42)
    with pytest.raises(DataError, match="not a safetensors file|not a batch file|empty or truncated"):
        spark_net.fit_paths(str(tmp_path / "notes" / "readme.txt"))
    with pytest.raises(ConfigError, match="loader must be a function"):
        spark_net.fit_paths(str(tmp_path / "notes"), loader="png")


def _paths(pattern: str) -> list[str]:
    return sorted(glob.glob(pattern))


def test_fit_paths_with_a_loader_for_png_files(spark, tmp_path) -> None:
    from PIL import Image

    def _png_loader(path: str) -> DataSet:
        """One grayscale PNG -> one example; the class is in the file name (``..._class2.png``)."""
        import fsspec
        from PIL import Image

        with fsspec.open(path, "rb") as f:
            pixels = np.asarray(Image.open(f).convert("L"), dtype=np.float32) / 255.0
        label = int(os.path.basename(path).rsplit("class", 1)[1].split(".")[0])
        return DataSet(torch.from_numpy(pixels).reshape(1, 1, *pixels.shape), torch.tensor([label]))

    rng = np.random.default_rng(0)
    examples = []
    for i in range(30):
        label = i % 3
        pixels = (rng.integers(0, 60, (8, 8)) + 60 * label).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(tmp_path / f"img{i:03d}_class{label}.png")
        examples.append((pixels, label))
    # the same examples as one-example batch files, in the same (name) order: the loader route must match it
    reference = [
        DataSet(torch.from_numpy(p.astype(np.float32) / 255.0).reshape(1, 1, 8, 8), torch.tensor([c]))
        for p, c in examples
    ]
    batch_paths = save_batches(reference, str(tmp_path / "reference"))

    def network() -> Network:
        return Network(models.lenet(1, 3, 8, 8), updater=optim.SGD(lr=0.05), seed=0)

    trained = []
    for source, loader in ((str(tmp_path / "*.png"), _png_loader), (str(tmp_path / "reference"), None)):
        net = network()
        SparkNetwork(spark, net, _master(), progress=False).fit_paths(source, epochs=2, loader=loader)
        trained.append(net.params())
    torch.testing.assert_close(trained[0], trained[1], atol=1e-6, rtol=1e-6)
    assert not torch.equal(trained[0], network().params())
    assert len(batch_paths) == 30


def _csv_reader() -> Callable[[str], DataSet]:
    """A loader for CSV shards ``x0,x1,label`` per line -> a DataSet of its rows (built inside a function, so it is
    shipped to the executors by value)."""

    def load(path: str) -> DataSet:
        import fsspec

        with fsspec.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", ndmin=2)
        return DataSet(
            torch.from_numpy(table[:, :2].astype(np.float32)), torch.from_numpy(table[:, 2].astype(np.int64))
        )

    return load


def _write_csv_shards(shards: list[DataSet], directory: Path) -> None:
    """``shard<k>.csv`` per shard: its two features and its label per row, exactly (17 significant digits)."""
    for k, shard in enumerate(shards):
        rows = torch.cat([shard.features.double(), shard.labels.double().unsqueeze(1)], dim=1).numpy()
        np.savetxt(directory / f"shard{k}.csv", rows, delimiter=",", fmt="%.17g")


def test_fit_paths_with_a_loader_for_csv_shards(spark, sc, tmp_path) -> None:
    _csv_loader = _csv_reader()
    data = _ids_dataset(0, 29)
    data = DataSet(data.features / 29.0, data.labels)
    shards = [data.slice(0, 11), data.slice(11, 14), data.slice(14, 29)]  # shards of 11, 3 and 15 rows
    _write_csv_shards(shards, tmp_path)
    reference = save_batches(shards, str(tmp_path / "reference"))

    trained = []
    for source, loader in (
        (str(tmp_path), _csv_loader),
        (sc.parallelize(_paths(f"{tmp_path}/*.csv"), 1), _csv_loader),
        (reference, None),
    ):
        net = _net()
        SparkNetwork(spark, net, _master(), progress=False).fit_paths(source, epochs=2, loader=loader)
        trained.append(net.params())
    torch.testing.assert_close(trained[0], trained[2], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(trained[1], trained[2], atol=1e-6, rtol=1e-6)

    with pytest.raises(DataError, match="the loader returned a ndarray"):
        SparkNetwork(spark, _net(), _master(), progress=False).fit_paths(str(tmp_path), loader=lambda p: np.zeros(3))


def test_evaluate_with_a_loader_reads_csv_shards_like_their_batch_files(spark, sc, tmp_path) -> None:
    """``evaluate(paths, loader=fn)``: the same evaluation as of the same examples saved as batch files, from a
    directory (every non-hidden file, not only batch files), a glob, a list and an RDD of paths; the same
    validation as ``fit_paths(loader=...)``."""
    _csv_loader = _csv_reader()
    data = _ids_dataset(0, 31)
    data = DataSet(data.features / 31.0, data.labels)
    shards = [data.slice(0, 12), data.slice(12, 13), data.slice(13, 31)]
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    _write_csv_shards(shards, csv_dir)
    reference = save_batches(shards, str(tmp_path / "reference"))
    net = _net()
    SparkNetwork(spark, net, _master(), progress=False, runner=InProcessRunner()).fit_paths(reference, epochs=3)
    spark_net = SparkNetwork(spark, net)
    expected = spark_net.evaluate(reference, batch_size=5)
    assert expected.accuracy() not in (0.0, 1.0)  # a comparison that can tell predictions apart
    listed = _paths(f"{csv_dir}/*.csv")
    for source in (str(csv_dir), f"{csv_dir}/*.csv", listed, sc.parallelize(listed, 2)):
        got = spark_net.evaluate(source, batch_size=5, loader=_csv_loader)
        assert got.confusion_matrix().tolist() == expected.confusion_matrix().tolist(), source
    roc = spark_net.evaluate_roc_multi_class(str(csv_dir), threshold_steps=0, loader=_csv_loader)
    assert roc.average_auc() == spark_net.evaluate_roc_multi_class(reference, threshold_steps=0).average_auc()

    with pytest.raises(DataError, match="holds no batch files"):  # without the loader the CSV files are not data
        spark_net.evaluate(str(csv_dir))
    with pytest.raises(ConfigError, match="loader must be a function"):
        spark_net.evaluate(str(csv_dir), loader="csv")
    frame = spark.createDataFrame([([0.5, 0.5], 1)], ["features", "label"])
    with pytest.raises(ConfigError, match="loader= reads files: pass paths"):
        spark_net.evaluate(frame, loader=_csv_loader)
    with pytest.raises(DataError, match="with loader= the data must be file paths, but it holds a DataSet"):
        spark_net.evaluate(sc.parallelize(shards, 1), loader=_csv_loader)
    with pytest.raises(DataError, match="the loader returned a ndarray"):
        spark_net.evaluate(str(csv_dir), loader=lambda p: np.zeros(3))


def test_a_second_export_into_the_same_directory_is_refused_and_evaluate_counts_one_export(spark, sc, tmp_path) -> None:
    directory = str(tmp_path / "twice")
    rdd = sc.parallelize([_ids_dataset(0, 18)], 1)
    first = export_batches(rdd, directory, BATCH)
    with pytest.raises(DataError, match=r"already holds 5 batch file\(s\).*empty \(or new\) directory"):
        export_batches(rdd, directory, BATCH)
    frame = spark.createDataFrame([(float(i), float(i), i % 3) for i in range(8)], ["a", "b", "label"])
    with pytest.raises(DataError, match="already holds"):  # the DataFrame route checks too
        export_batches(frame, directory, BATCH, features_col=["a", "b"])
    assert sorted(glob.glob(os.path.join(directory, "*.safetensors"))) == sorted(first)
    net = Network(models.mlp(2, 4, 3), updater=optim.Adam(lr=1e-3), seed=0)
    assert SparkNetwork(spark, net, progress=False).evaluate(directory).num_examples() == 18


def test_fits_of_one_dataframe_reuse_its_export_and_a_new_dataframe_is_exported_anew(spark) -> None:
    data = DataSet(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    rows = [(data.features[i].tolist(), int(data.labels[i])) for i in range(64)]
    df = spark.createDataFrame(rows, "features array<float>, label int").coalesce(1)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, averaging_frequency=2, num_workers=2)
    with SparkNetwork(spark, mlp_net(4, 8, 3), master, progress=False) as spark_net:
        spark_net.fit(df, epochs=1)
        first = dict(spark_net.preparation.exports)
        spark_net.fit(df, epochs=1)
        assert spark_net.preparation.exports == first  # the second fit trained from the first fit's files
        spark_net.fit(df.select("label", "features"), epochs=1)  # a new DataFrame object: new data, new export
        assert len(spark_net.preparation.exports) == 2
        gc.collect()
        spark_net.fit(df.select("features", "label"), epochs=1)
        assert len(spark_net.preparation.frames) == 2  # df's and the newest: the collected frame's RDD is let go
