"""``torchspark train --data``: train on the user's own data instead of a built-in dataset.

``--data`` names a Parquet file or directory (any URL Spark reads: ``s3a://``, ``abfss://``, ``/Volumes/...``) or a
table of the session's catalog (``table:NAME``), with the columns ``--features-col`` (an array or ML Vector of
numbers) and ``--label-col`` (class indices 0..K-1). The model is evaluated on ``--test-data`` or, without it, on
``--test-fraction`` of ``--data`` held out with ``--seed`` (``DataFrame.randomSplit``). Everything runs on the
session: the rows stream to the workers through Arrow and are never collected on this machine.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError, DataError

__all__ = [
    "DEFAULT_TEST_FRACTION",
    "TABLE_PREFIX",
    "UserData",
    "fit_user_data",
    "read_source",
    "user_data",
]

#: ``--data table:NAME`` reads a table of the session's catalog
TABLE_PREFIX = "table:"
#: the part of ``--data`` held out for the evaluation when ``--test-data`` is not given
DEFAULT_TEST_FRACTION = 0.2


def read_source(spark: Any, spec: str, option: str) -> Any:
    """The DataFrame ``spec`` names: ``table:NAME`` (the session's catalog) or a Parquet path or URL.

    Raises:
        ConfigError: an empty table name, or a local path that does not exist.
        DataError: Spark cannot read it (its first line).
    """
    from torchspark.spark.predict import read_parquet, read_table

    if spec.startswith(TABLE_PREFIX):
        name = spec[len(TABLE_PREFIX) :].strip()
        if not name:
            raise ConfigError(
                f"{option} {spec!r} names no table; write {option} table:NAME (e.g. table:main.ml.digits)"
            )
        return read_table(spark, name, option)
    if "://" not in spec and not os.path.exists(spec):
        raise ConfigError(
            f"{option} {spec!r} does not exist; pass a Parquet file or directory (any URL Spark reads, e.g. "
            f"s3a://bucket/train) or table:NAME"
        )
    return read_parquet(spark, spec, option)


def _check_columns(frame: Any, args: argparse.Namespace, option: str, spec: str) -> None:
    for flag, column in (("--features-col", args.features_col), ("--label-col", args.label_col)):
        if column not in frame.columns:
            raise ConfigError(
                f"{flag} {column!r} is not a column of {option} {spec!r} (its columns: {list(frame.columns)}); pass "
                f"{flag} with one of them"
            )


@dataclass(frozen=True)
class UserData:
    """The user's training and test DataFrames, with what the model is built from."""

    train: Any
    test: Any
    #: each example's shape as the network sees it: ``--feature-shape``, else the length of the first row
    sample_shape: tuple[int, ...]
    #: ``--num-classes``, else the largest label + 1
    n_classes: int
    n_train: int
    n_test: int


def _row_length(frame: Any, column: str, spec: str) -> int:
    first = frame.select(column).head(1)
    if not first or first[0][0] is None:
        raise DataError(f"--data {spec!r}: the first row's {column!r} is empty; every row needs its features")
    value = first[0][0]
    return int(value.size) if hasattr(value, "size") and not isinstance(value, (list, tuple)) else len(value)


def _classes(frame: Any, column: str, spec: str, given: int | None) -> int:
    from torchspark.spark.predict import column_range

    lo, hi = column_range(frame, column)
    if lo is None:
        raise DataError(f"--data {spec!r}: the label column {column!r} has no values")
    if lo < 0 or float(hi) != math.floor(float(hi)):
        raise DataError(
            f"--data {spec!r}: the labels of {column!r} run from {lo} to {hi}; train's classifiers take class "
            "indices 0..K-1 (map your classes to integers first, e.g. with pyspark.ml.feature.StringIndexer)"
        )
    found = int(hi) + 1
    if given is not None and given < found:
        raise DataError(f"--num-classes {given} is fewer than the labels need: the largest label is {int(hi)}")
    return given if given is not None else found


def user_data(spark: Any, args: argparse.Namespace) -> UserData:
    """Read ``--data`` (and ``--test-data``), check the columns and labels, and hold out the test part.

    Raises:
        ConfigError: a missing column or path.
        DataError: an unreadable source, an empty split, labels that are not class indices.
    """
    frame = read_source(spark, args.data, "--data")
    _check_columns(frame, args, "--data", args.data)
    if args.test_data is not None:
        train, test = frame, read_source(spark, args.test_data, "--test-data")
        _check_columns(test, args, "--test-data", args.test_data)
    else:
        fraction = DEFAULT_TEST_FRACTION if args.test_fraction is None else args.test_fraction
        train, test = frame.randomSplit([1.0 - fraction, fraction], seed=args.seed)
    n_classes = _classes(frame, args.label_col, args.data, args.num_classes)
    n_train, n_test = train.count(), test.count()
    for count, what in ((n_train, "training"), (n_test, "test")):
        if count == 0:
            raise DataError(
                f"--data {args.data!r} leaves no {what} rows; pass more data, or --test-data / --test-fraction"
            )
    shape = tuple(args.feature_shape) if args.feature_shape else (_row_length(train, args.features_col, args.data),)
    return UserData(train, test, shape, n_classes, n_train, n_test)


def fit_user_data(
    spark: Any,
    args: argparse.Namespace,
    data: UserData,
    build: Callable[[Sequence[int], int], Any],
    master: Any,
    progress: dict[str, Any],
) -> tuple[Any, Any]:
    """Train the network ``build(sample_shape, n_classes)`` makes on ``data.train`` with ``master``; returns the
    `SparkNetwork` and the evaluation on ``data.test``."""
    from torchspark.spark import SparkNetwork

    columns = dict(features_col=args.features_col, label_col=args.label_col, feature_shape=args.feature_shape)
    spark_net = SparkNetwork(
        spark,
        build(data.sample_shape, data.n_classes),
        master,
        progress=False if args.no_progress else None,
        **progress,
    )
    try:
        spark_net.fit(data.train, epochs=args.epochs, **columns)
        return spark_net, spark_net.evaluate(data.test, **columns)
    finally:
        spark_net.delete_temp_files()
