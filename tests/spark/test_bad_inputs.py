"""The bad-input catalogue: what a new user (or an attacker) gets wrong, and what torchspark answers.

One case per mistake. Each asserts the error class, that the message names the bad value and says the fix (the
``says`` substrings, case-insensitive), and that nothing is left behind: the case's working directory holds what it
held before the call, and the temp directory (``tempfile.tempdir``, where default exports go) stays empty. The
The errors guide (docs/guides/errors.md) lists these cases. Cases marked ``spark`` run on the shared real local session.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import own_models
from helpers import mlp_net
from keyword_model import TinySequenceClassifier
from torchspark import DataSet, MultiDataSet, Network, models, optim
from torchspark.data import Columns, load_batch, save_batch, save_batches
from torchspark.errors import ConfigError, DataError, SerializationError, SetupError, TrainingError
from torchspark.parallel import ParallelWrapper
from torchspark.training.assignment import plan_balanced
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, master_from_json
from torchspark.training.config.shared_master import SharedTrainingMaster


def _evaluation_from_json(text: str) -> Any:
    from torchspark.evaluation import evaluation_from_json

    return evaluation_from_json(text)


X = np.random.default_rng(0).random((20, 6), dtype=np.float32)
Y = np.random.default_rng(1).integers(0, 3, 20)


@dataclasses.dataclass
class Ctx:
    """What a case works with: its own directory, the Spark session (spark cases), what setup made."""

    work: Path
    spark: Any = None
    made: Any = None
    cleanup: list[Callable[[], None]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Ctx], Any]
    error: type[Exception]
    says: tuple[str, ...]
    setup: Callable[[Ctx], Any] | None = None
    spark: bool = False


def _net(loss: str = "cross_entropy", n_in: int = 6) -> Network:
    return mlp_net(n_in, 8, 3, loss=loss, updater=optim.SGD(lr=0.1))


def _with(x: np.ndarray, index: tuple[int, int], value: float) -> np.ndarray:
    out = x.copy()
    out[index] = value
    return out


def _pw(**kw: Any) -> ParallelWrapper:
    return ParallelWrapper(_net(), num_workers=2, progress=False, **kw)


# ------------------------------------------------------------------ files made before the call
def _corrupt(ctx: Ctx) -> str:
    path = ctx.work / "corrupt.safetensors"
    path.write_bytes(b"this is not a batch file at all" * 4)
    return str(path)


def _truncated(ctx: Ctx) -> str:
    path = ctx.work / "batch.safetensors"
    save_batch(DataSet(X, Y), str(path))
    path.write_bytes(path.read_bytes()[:100])
    return str(path)


def _a_file(ctx: Ctx) -> str:
    path = ctx.work / "a-file"
    path.write_text("x")
    return str(path)


def _full_disk(ctx: Ctx, size: str = "64k") -> str:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = ctx.work / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    ctx.cleanup.append(lambda: subprocess.run(["umount", str(mount)], check=False))
    return str(mount)


def _frame(ctx: Ctx, rows: list[tuple[Any, Any]], schema: str) -> Any:
    return ctx.spark.createDataFrame(rows, schema)


def _spark_fit(ctx: Ctx, data: Any, features_col: Any = "features", **master: Any) -> Any:
    from torchspark.spark import SparkNetwork

    options = dict(batch_size_per_worker=4, num_workers=2, export_directory=str(ctx.work / "export"))
    options.update(master)
    net = SparkNetwork(ctx.spark, _net(), ParameterAveragingTrainingMaster(**options), progress=False)
    return net.fit(data, features_col=features_col)


def _spark_fit_columns(ctx: Ctx, **columns: Any) -> Any:
    from torchspark.spark import SparkNetwork

    master = ParameterAveragingTrainingMaster(batch_size_per_worker=4, num_workers=2)
    frame = _frame(ctx, _rows(), "x array<double>, label long")
    return SparkNetwork(ctx.spark, _net(), master, progress=False).fit(frame, **columns)


def _shard_files(ctx: Ctx) -> str:
    shards = ctx.work / "shards"
    shards.mkdir()
    for name in ("a.txt", "b.txt"):
        (shards / name).write_text("8 examples")
    return str(shards)


def _loader_fit(ctx: Ctx, wide: str) -> Any:
    """fit_paths with a loader that gives 7 features per example for files whose name is in ``wide`` (the
    network takes 6)."""
    from torchspark.spark import SparkNetwork

    def shard_loader(path: str) -> DataSet:
        width = 7 if os.path.basename(path) in wide else 6
        return DataSet(np.ones((8, width), dtype=np.float32), np.zeros(8, dtype=np.int64))

    master = ParameterAveragingTrainingMaster(batch_size_per_worker=4, num_workers=2)
    return SparkNetwork(ctx.spark, _net(), master, progress=False).fit_paths(ctx.made, loader=shard_loader)


def _rows(n: int = 8, width: int = 6) -> list[tuple[list[float], int]]:
    return [([float(i + j) for j in range(width)], i % 3) for i in range(n)]


# ------------------------------------------------------------------ saved models and the CLI (hardening items 1-4)
def _saved(ctx: Ctx, name: str = "model", hidden: int = 8) -> str:
    path = str(ctx.work / name)
    Network(models.mlp(64, hidden, 10), updater=optim.Adam(lr=1e-3), seed=0).save(path)
    return path


def _hostile_factory(ctx: Ctx) -> str:
    path = _saved(ctx)
    config = json.loads(Path(path, "config.json").read_text())
    config["module"] = {"factory": "os:system", "kwargs": {"command": f"touch {ctx.work / 'pwned'}"}}
    Path(path, "config.json").write_text(json.dumps(config))
    return path


def _own_saved(ctx: Ctx, module: Any, edit: Callable[[dict[str, Any]], None] | None = None) -> str:
    """A network of a user-defined module (tests/own_models.py) saved, its config.json then edited by ``edit``."""
    path = str(ctx.work / "own")
    Network(module, seed=0).save(path)
    if edit is not None:
        config = json.loads(Path(path, "config.json").read_text())
        edit(config)
        Path(path, "config.json").write_text(json.dumps(config))
    return path


def _garbage_config(ctx: Ctx) -> str:
    path = _saved(ctx)
    Path(path, "config.json").write_bytes(b"\x80\x81 binary garbage")
    return path


def _foreign_directory(ctx: Ctx) -> str:
    (ctx.work / "mine").mkdir()
    (ctx.work / "mine" / "notes.txt").write_text("my notes")
    return str(ctx.work / "mine")


def _model_on_a_full_disk(ctx: Ctx) -> str:
    return _saved(ctx, os.path.join(_full_disk(ctx, "160k"), "model"), hidden=128)  # ~116 KB of 160 KiB


def _evaluation_json(kind: str) -> str:
    from torchspark.evaluation import Evaluation

    data = json.loads(Evaluation().to_json())
    data["type"] = kind
    return json.dumps(data)


def _cli_check(*argv: str) -> None:
    from torchspark import cli
    from torchspark.cli_checks import check_arguments

    check_arguments(cli.build_parser().parse_args(list(argv)))


def _scheduler_without_t_max(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer)  # T_max forgotten: torch raises TypeError


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CASES = [
    # -- shapes, dtypes, labels (item 5: the advice names the loss, the shape and the fix)
    Case(
        "feature-width",
        lambda c: _net().fit(DataSet(np.random.rand(20, 7).astype(np.float32), Y)),
        DataError,
        ("shape (20, 7)", "check the feature shape"),
    ),
    Case(
        "integer-features",
        lambda c: _net().fit(DataSet(np.ones((20, 6), dtype=np.int64), Y)),
        DataError,
        ("dtype int64", "float32", "cast the features"),
    ),
    Case(
        "float-labels-n1-cross-entropy",
        lambda c: _net().fit(DataSet(X, Y.reshape(-1, 1).astype(np.float32))),
        DataError,
        ("'cross_entropy'", "(20, 1)", "reshape(-1)"),
    ),
    Case(
        "int-labels-n1-cross-entropy",
        lambda c: _net().fit(DataSet(X, Y.reshape(-1, 1))),
        DataError,
        ("'cross_entropy'", "(20, 1)", "integer class indices"),
    ),
    Case(
        "class-indices-with-mse",
        lambda c: _net("mse").fit(DataSet(X, Y)),
        DataError,
        ("'mse'", "(20,)", "one_hot", "loss='cross_entropy'"),
    ),
    Case(
        "class-indices-with-bce",
        lambda c: _net("bce_with_logits").fit(DataSet(X, Y)),
        DataError,
        ("'bce_with_logits'", "(20,)", "one_hot"),
    ),
    Case(
        "one-hot-width",
        lambda c: _net().fit(DataSet(X, np.eye(5, dtype=np.float32)[Y])),
        DataError,
        ("'cross_entropy'", "(20, 5)", "(N, 3)"),
    ),
    Case(
        "float-1d-labels",
        lambda c: DataSet(X, Y.astype(np.float32)),
        DataError,
        ("1-D with float dtype", "astype('int64')", "reshape(-1, 1)"),
    ),
    Case(
        "label-too-large",
        lambda c: _net().fit(DataSet(X, np.where(Y == 0, 5, Y))),
        DataError,
        ("label index 5", "[0, 2]", "more outputs"),
    ),
    Case(
        "label-negative",
        lambda c: _net().fit(DataSet(X, np.where(Y == 0, -1, Y))),
        DataError,
        ("label index -1", "[0, 2]"),
    ),
    Case(
        "lengths-differ",
        lambda c: DataSet(X, Y[:10]),
        DataError,
        ("10 examples", "20", "first dimension must be the number of examples"),
    ),
    Case(
        "string-features",
        lambda c: DataSet(np.array([["a"] * 6] * 20), Y),
        DataError,
        ("dtype <U1", "convert it to numbers"),
    ),
    Case("ragged-features", lambda c: DataSet([[1.0, 2.0], [3.0]], [0, 1]), DataError, ("got list", "numpy.asarray")),
    Case("scalar-features", lambda c: DataSet(np.float32(1.0), Y[:1]), DataError, ("scalar", "reshape to (1, ...)")),
    Case("no-labels", lambda c: _net().fit(DataSet(X)), DataError, ("labels=None", "DataSet(features, labels)")),
    # -- NaN / Inf / empty / item types
    Case(
        "nan-feature",
        lambda c: _net().fit(DataSet(_with(X, (3, 2), np.nan), Y)),
        DataError,
        ("NaN at example 3", "drop or repair"),
    ),
    Case(
        "inf-feature",
        lambda c: _net().fit(DataSet(_with(X, (4, 1), np.inf), Y)),
        DataError,
        ("Inf at example 4", "drop or repair"),
    ),
    Case(
        "empty-dataset", lambda c: _net().fit(DataSet(X[:0], Y[:0])), DataError, ("0 examples", "at least one example")
    ),
    Case("strings-as-batches", lambda c: _net().fit(["a", "b"]), DataError, ("a str", "DataSet(features, labels)")),
    # -- PyTorch data and models (a DataLoader's batches, a model computing its own loss)
    Case(
        "dataloader-yields-strings",
        lambda c: _net().fit(DataLoader(["a", "b"], batch_size=2, collate_fn="".join)),
        DataError,
        ("batch 0", "a str", "a tuple/list (features, labels)", "a dict of named tensors"),
    ),
    Case(
        "dataloader-three-tensors",
        lambda c: _net().fit(DataLoader(TensorDataset(torch.tensor(X), torch.tensor(X), torch.tensor(Y)), 4)),
        DataError,
        ("batch 0", "list of 3 items", "((x1, x2), y)"),
    ),
    Case(
        "dataloader-text-column",
        lambda c: _net().fit(DataLoader([{"text": "a b", "labels": 1}] * 4, batch_size=2)),
        DataError,
        ("batch 0", "entry 'text' is a list of str", "not a tensor"),
    ),
    Case(
        "own-loss-without-labels",
        lambda c: Network(TinySequenceClassifier(), loss=None).fit(
            MultiDataSet({"input_ids": np.ones((4, 5), dtype=np.int64), "attention_mask": np.ones((4, 5))})
        ),
        DataError,
        ("loss=None", "no labels", "'labels' entry"),
    ),
    Case(
        "own-loss-model-takes-no-labels",
        lambda c: Network(torch.nn.Linear(6, 3), loss=None).fit(DataSet(X, Y)),
        ConfigError,
        ("Linear.forward takes no labels", "pass loss='cross_entropy'"),
    ),
    Case(
        "wrapper-dataloader-with-sampler",
        lambda c: _pw().fit(
            DataLoader(
                TensorDataset(torch.tensor(X), torch.tensor(Y)), 4, sampler=WeightedRandomSampler([1.0] * 20, 20)
            )
        ),
        ConfigError,
        ("WeightedRandomSampler", "pass the dataset"),
    ),
    Case(
        "wrapper-single-path",
        lambda c: _pw().fit("x.safetensors"),
        DataError,
        ("'x.safetensors'", "does not exist", "check the path"),
    ),
    Case("wrapper-empty-list", lambda c: _pw().fit([]), DataError, ("empty",)),
    Case("wrapper-not-iterable", lambda c: _pw().fit(42), DataError, ("a int", "pass a DataSet")),
    Case(
        "wrapper-mixed-kinds",
        lambda c: _pw().fit([DataSet(X, Y), DataSet(X, Y).to_multi()]),
        DataError,
        ("mixes DataSets and MultiDataSets", "to_multi"),
    ),
    # -- batch sizes, frequencies, worker counts and other options
    Case(
        "batch-size-zero",
        lambda c: ParameterAveragingTrainingMaster(batch_size_per_worker=0),
        ConfigError,
        ("batch_size_per_worker", "got 0", ">= 1"),
    ),
    Case(
        "averaging-frequency-zero",
        lambda c: ParameterAveragingTrainingMaster(averaging_frequency=0),
        ConfigError,
        ("averaging_frequency", "got 0", ">= 1"),
    ),
    Case(
        "num-workers-zero", lambda c: SharedTrainingMaster(num_workers=0), ConfigError, ("num_workers", "got 0", ">= 1")
    ),
    Case(
        "shake-frequency-negative",
        lambda c: SharedTrainingMaster(shake_frequency=-5),
        ConfigError,
        ("shake_frequency", "-5", ">= 0"),
    ),
    Case(
        "repartition-unknown",
        lambda c: ParameterAveragingTrainingMaster(repartition="sometimes"),
        ConfigError,
        ("'sometimes'", "'always'"),
    ),
    Case(
        "storage-level-unknown",
        lambda c: ParameterAveragingTrainingMaster(storage_level="RAM"),
        ConfigError,
        ("'RAM'", "MEMORY_ONLY"),
    ),
    Case(
        "data-timeout-zero",
        lambda c: ParameterAveragingTrainingMaster(data_timeout_s=0),
        ConfigError,
        ("data_timeout_s", "got 0", "> 0"),
    ),
    Case(
        "drop-last-with-spark-default",
        lambda c: ParameterAveragingTrainingMaster(drop_last=True, repartition_strategy="spark_default"),
        ConfigError,
        ("'spark_default'", "drop_last=False"),
    ),
    Case(
        "drop-last-smaller-than-a-batch",
        lambda c: plan_balanced([5], 8, 2, None, drop_last=True),
        DataError,
        ("5 examples", "batch_size=8", "drop_last=False"),
    ),
    Case(
        "on-divergence-unknown",
        lambda c: SharedTrainingMaster(on_divergence="ignore"),
        ConfigError,
        ("'ignore'", "['fail', 'warn']"),
    ),
    Case(
        "fit-batch-size-zero",
        lambda c: _pw().fit(DataSet(X, Y), batch_size=0),
        ConfigError,
        ("batch_size", "got 0", ">= 1"),
    ),
    Case("fit-epochs-zero", lambda c: _pw().fit(DataSet(X, Y), epochs=0), ConfigError, ("epochs", "got 0", ">= 1")),
    Case("wrapper-workers-zero", lambda c: ParallelWrapper(_net(), num_workers=0), ConfigError, ("workers", "got 0")),
    Case(
        "wrapper-options-and-master",
        lambda c: ParallelWrapper(
            _net(), num_workers=2, averaging_frequency=3, master=ParameterAveragingTrainingMaster()
        ),
        ConfigError,
        ("['averaging_frequency']", "set them on the master"),
    ),
    Case(
        "loss-unknown",
        lambda c: Network(models.mlp(6, 8, 3), loss="crossentropy"),
        ConfigError,
        ("'crossentropy'", "cross_entropy"),
    ),
    Case(
        "updater-unknown", lambda c: Network(models.mlp(6, 8, 3), updater="adamw2"), ConfigError, ("'adamw2'", "adam")
    ),
    Case(
        "updater-factory-raises",
        lambda c: Network(models.mlp(6, 8, 3), updater=functools.partial(torch.optim.Adam, lr=-1.0)),
        ConfigError,
        ("updater factory", "Adam'>, lr=-1.0", "Invalid learning rate", "functools.partial(torch.optim.AdamW"),
    ),
    Case(
        "lr-scheduler-factory-raises",
        lambda c: Network(models.mlp(6, 8, 3), lr_scheduler=_scheduler_without_t_max),
        ConfigError,
        ("_scheduler_without_t_max", "raised TypeError", "T_max", "must return a torch.optim.lr_scheduler"),
    ),
    Case(
        "lr-scheduler-not-a-scheduler",
        lambda c: Network(models.mlp(6, 8, 3), lr_scheduler=lambda opt: opt),
        ConfigError,
        ("returned SGD", "expected a torch.optim.lr_scheduler scheduler"),
    ),
    Case("master-json-invalid", lambda c: master_from_json("{not json"), ConfigError, ("invalid",)),
    Case(
        "master-json-unknown-type",
        lambda c: master_from_json('{"type": "magic"}'),
        ConfigError,
        ("'magic'", "averaging"),
    ),
    Case(
        "master-json-unknown-option",
        lambda c: master_from_json('{"type": "averaging", "speed": 9}'),
        ConfigError,
        ("['speed']", "ParameterAveragingTrainingMaster"),
    ),
    # -- batch files, directories, URLs, a full disk
    Case("batch-file-corrupt", lambda c: load_batch(c.made), DataError, ("corrupt.safetensors",), setup=_corrupt),
    Case("batch-file-truncated", lambda c: load_batch(c.made), DataError, ("batch.safetensors",), setup=_truncated),
    Case(
        "batch-file-missing",
        lambda c: load_batch(str(c.work / "nope.safetensors")),
        DataError,
        ("nope.safetensors", "check the path"),
    ),
    Case(
        "wrapper-missing-paths",
        lambda c: _pw().fit([str(c.work / "gone.safetensors")]),
        DataError,
        ("gone.safetensors", "check the path"),
    ),
    Case(
        "batch-directory-is-a-file",
        lambda c: save_batches([DataSet(X, Y)], c.made),
        DataError,
        ("a-file", "choose a writable directory"),
        setup=_a_file,
    ),
    Case(
        "batch-directory-unknown-protocol",
        lambda c: save_batches([DataSet(X, Y)], "foo://bucket/x"),
        ConfigError,
        ("'foo'", "use a local path"),
    ),
    Case(
        "batch-directory-hdfs-without-backend",
        lambda c: save_batches([DataSet(X, Y)], "hdfs://nn:8020/x"),
        ConfigError,
        ("hdfs://", "HadoopFileSystem", "install it"),
    ),
    Case(
        "batch-file-on-a-full-disk",
        lambda c: save_batch(
            DataSet(np.zeros((4096, 64), np.float32), Y[:1].repeat(4096)), os.path.join(c.made, "big.safetensors")
        ),
        DataError,
        ("big.safetensors", "free space"),
        setup=_full_disk,
    ),
    Case(
        "model-directory-missing", lambda c: Network.load(str(c.work / "no-model")), SerializationError, ("no-model",)
    ),
    # -- no code from files, atomic saves, CLI checks first (items 1, 2, 4)
    Case(
        "model-config-names-os-system",
        lambda c: Network.load(c.made),
        SerializationError,
        ("'os:system'", "factories=[system]", "trust_code=True"),
        setup=_hostile_factory,
    ),
    Case(
        "model-class-not-allowed",
        lambda c: Network.load(c.made),
        SerializationError,
        ("'own_models:CapturedMLP'", "factories=[CapturedMLP]", "trust_code=True", "module=CapturedMLP(...)"),
        setup=lambda c: _own_saved(c, own_models.CapturedMLP(4, hidden=8)),
    ),
    Case(
        "model-class-that-no-longer-imports",
        lambda c: Network.load(c.made, trust_code=True),
        SerializationError,
        ("'gone_package.models:CapturedMLP'", "cannot import", "module=CapturedMLP(...)"),
        setup=lambda c: _own_saved(
            c,
            own_models.CapturedMLP(4, hidden=8),
            lambda config: config["module"].update(factory="gone_package.models:CapturedMLP"),
        ),
    ),
    Case(
        "model-class-saved-without-its-arguments",
        lambda c: Network.load(c.made, trust_code=True),
        SerializationError,
        ("'own_models:MLP'", "requires n_in, hidden, n_out", "@torchspark.nn.capture", "module=MLP(...)"),
        setup=lambda c: _own_saved(c, own_models.MLP(4, 8, 3)),
    ),
    Case(
        "model-module-of-the-wrong-architecture",
        lambda c: Network.load(c.made, module=own_models.MLP(4, 6, 3)),
        SerializationError,
        (
            "fc1.weight: saved [8, 4], the module has [6, 4]",
            "fc2.weight: saved [3, 8], the module has [3, 6]",
            "module= must be the architecture the file was saved from (own_models:MLP)",
        ),
        setup=lambda c: _own_saved(c, own_models.MLP(4, 8, 3)),
    ),
    Case(
        "model-config-not-json",
        lambda c: Network.load(c.made),
        SerializationError,
        ("config.json", "is not valid JSON"),
        setup=_garbage_config,
    ),
    Case(
        "master-json-names-os-system",
        lambda c: master_from_json('{"type": "os:system"}'),
        ConfigError,
        ("'os:system'", "known: ['averaging', 'sharing']"),
    ),
    Case(
        "evaluation-json-names-os-system",
        lambda c: _evaluation_from_json(_evaluation_json("os:system")),
        SerializationError,
        ("'os:system'", "known types"),
    ),
    Case(
        "save-over-a-directory-of-other-files",
        lambda c: _net().save(c.made),
        SerializationError,
        ("['notes.txt']", "save to a new or empty directory"),
        setup=_foreign_directory,
    ),
    Case(
        "save-onto-a-file",
        lambda c: _net().save(c.made),
        SerializationError,
        ("a-file", "exists and is not a directory", "save to a directory path"),
        setup=_a_file,
    ),
    Case(
        "save-model-on-a-full-disk",
        lambda c: Network(models.mlp(64, 128, 10), updater=optim.Adam(lr=1e-3), seed=1).save(c.made),
        SerializationError,
        ("the disk is full", "unchanged"),
        setup=_model_on_a_full_disk,
    ),
    Case(
        "cli-output-under-proc",
        lambda c: _cli_check("train", "--output", "/proc/torchspark-out"),
        ConfigError,
        ("'/proc/torchspark-out'", "choose a writable location"),
    ),
    Case(
        "cli-output-is-a-file",
        lambda c: _cli_check("train", "--output", c.made),
        ConfigError,
        ("a-file", "pass a directory path"),
        setup=_a_file,
    ),
    Case(
        "cli-master-unknown-scheme",
        lambda c: _cli_check("train", "--master", "foo://"),
        ConfigError,
        ("'foo://'", "spark://HOST:PORT"),
    ),
    Case(
        "cli-master-unreachable",
        lambda c: _cli_check("train", "--master", f"spark://127.0.0.1:{c.made}"),
        ConfigError,
        ("cannot reach the master", "check the host and port"),
        setup=lambda c: _closed_port(),
    ),
    # -- Spark: DataFrame columns, data kinds, workers
    Case(
        "dataframe-missing-column",
        lambda c: _spark_fit(c, _frame(c, _rows(), "x array<double>, label long")),
        DataError,
        ("['features']", "features_col="),
        spark=True,
    ),
    Case(
        "dataframe-columns-given-twice",
        lambda c: _spark_fit_columns(c, features_col="x", columns=Columns("x", "label")),
        ConfigError,
        ("columns=Columns(", "features_col='x'", "pass one"),
        spark=True,
    ),
    Case(
        "dataframe-keyword-column-missing",
        lambda c: _spark_fit_columns(c, features_col={"input_ids": "x", "attention_mask": "attn"}),
        ConfigError,
        ("attention_mask='attn'", "no column(s) ['attn']", "['x', 'label']", "Map each keyword input"),
        spark=True,
    ),
    Case(
        "dataframe-keyword-column-not-numeric",
        lambda c: _spark_fit(
            c, _frame(c, [("a b", 0)] * 8, "text string, label long"), features_col={"input_ids": "text"}
        ),
        DataError,
        ("'text'", "type string", "cast('double')"),
        spark=True,
    ),
    Case(
        "dataframe-string-features",
        lambda c: _spark_fit(c, _frame(c, [("a b", 0)] * 8, "features string, label long")),
        DataError,
        ("'features'", "type string", "cast('double')"),
        spark=True,
    ),
    Case(
        "dataframe-string-labels",
        lambda c: _spark_fit(c, _frame(c, [(r, str(y)) for r, y in _rows()], "features array<double>, label string")),
        DataError,
        ("'label'", "type string", "StringIndexer"),
        spark=True,
    ),
    Case(
        "dataframe-null-features-row",
        lambda c: _spark_fit(c, _frame(c, [*_rows(7), (None, 1)], "features array<double>, label long")),
        TrainingError,
        ("'features'", "null row", "dropna"),
        spark=True,
    ),
    Case(
        "dataframe-ragged-arrays",
        lambda c: _spark_fit(c, _frame(c, [*_rows(7), ([1.0, 2.0], 1)], "features array<double>, label long")),
        TrainingError,
        ("'features'", "different lengths"),
        spark=True,
    ),
    Case(
        "dataframe-fractional-labels",
        lambda c: _spark_fit(c, _frame(c, [(r, y + 0.5) for r, y in _rows()], "features array<double>, label double")),
        TrainingError,
        ("'label'", "non-integer values (e.g.", ".5)", "loss='mse'"),
        spark=True,
    ),
    Case("spark-data-is-a-list", lambda c: _spark_fit(c, [DataSet(X, Y)]), DataError, ("got list", "RDD"), spark=True),
    Case(
        "spark-too-many-workers",
        lambda c: _spark_fit(c, c.spark.sparkContext.parallelize([DataSet(X, Y)], 1), num_workers=9),
        SetupError,
        ("num_workers=9", "Lower num_workers"),
        spark=True,
    ),
    Case(
        "spark-loader-wrong-shape-for-one-file",
        lambda c: _loader_fit(c, "b.txt"),
        DataError,
        ("shard_loader", "b.txt", "expected features (6,) float32", "got features (7,) float32", "fix the loader"),
        setup=_shard_files,
        spark=True,
    ),
    Case(
        "spark-loader-wrong-shape-for-the-network",
        lambda c: _loader_fit(c, "a.txt b.txt"),
        DataError,
        ("shard_loader", "a.txt", "features (7,) float32", "does not take", "check the feature shape"),
        setup=_shard_files,
        spark=True,
    ),
    Case(
        "spark-repartition-never-mismatch",
        lambda c: _spark_fit(c, c.spark.sparkContext.parallelize([DataSet(X, Y)] * 3, 3), repartition="never"),
        ConfigError,
        ("3 partitions", "num_workers=2", "repartition='always'"),
        spark=True,
    ),
    Case(
        "spark-export-directory-unknown-protocol",
        lambda c: _spark_fit(c, c.spark.sparkContext.parallelize([DataSet(X, Y)], 2), export_directory="foo://x/y"),
        ConfigError,
        ("'foo'", "use a local path"),
        spark=True,
    ),
]


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.spark] if c.spark else []) for c in CASES]
)
def test_bad_input(case: Case, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    work, scratch = tmp_path / "work", tmp_path / "temp"
    work.mkdir()
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(work)
    ctx = Ctx(work, spark=request.getfixturevalue("spark") if case.spark else None)
    if case.spark:
        (work / "export").mkdir()  # the user's export_directory: kept, but must hold nothing after a failed fit
    try:
        ctx.made = case.setup(ctx) if case.setup else None
        before = _listing(work)
        with pytest.raises(case.error) as info:
            case.run(ctx)
        message = str(info.value)
        print(f"{case.id}: {type(info.value).__name__}: {message.splitlines()[0]}")
        for part in case.says:
            assert part.lower() in message.lower(), f"{part!r} not in: {message}"
        assert _listing(work) == before, "the failed call left files behind"
        # (torch's own compile cache, made once per process on first use, is not ours)
        left = {p for p in _listing(scratch) if not p.startswith("torchinductor_")}
        assert left == set(), "the failed call left files in the temp directory"
    finally:
        for undo in reversed(ctx.cleanup):
            undo()


def test_the_catalogue_has_at_least_40_cases_with_unique_names() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)
