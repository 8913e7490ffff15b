"""``torchspark train`` on Spark: a classic session (an RDD of the digits) or a Spark Connect session
(``--connect``: a Connect server started on this machine; ``--remote sc://HOST:PORT``: a running one), where the
digits travel as a DataFrame."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["train_on_spark", "train_on_connect", "train_session", "connect_progress", "digits_frame"]


def digits_frame(spark: Any, split: str) -> Any:
    """The digits split ``split`` as a DataFrame: ``features`` (64 doubles, flattened 1x8x8), ``label``."""
    from torchspark import datasets

    data = datasets.digits(split)
    rows = [(data.features[i].flatten().tolist(), int(data.labels[i])) for i in range(len(data))]  # type: ignore[index]
    return spark.createDataFrame(rows, ["features", "label"])


def train_on_spark(
    args: argparse.Namespace, net: Any, train_data: Any, master: Any
) -> tuple[Any, float, dict[str, Any]]:
    """``torchspark train`` on Spark with ``master``; returns the training stats, the score, and what was used (for
    metrics.json): the seconds the session took to start and the fit took, the session's ``spark_master`` and the
    ``master``'s settings. ``--connect`` / ``--remote`` go through `train_on_connect`."""
    from torchspark.spark import (
        SparkNetwork,
        check_java,
        session_scope,
    )

    if args.connect or args.remote:
        return train_on_connect(args, net, train_data, master)
    check_java()
    start = time.time()
    with session_scope(cores=args.num_workers, master=args.master, quiet=not args.verbose) as spark:
        started = time.time()
        rdd = spark.sparkContext.parallelize(train_data.split(64), max(args.num_workers, 2))
        spark_net = SparkNetwork(spark, net, master, progress=False if args.no_progress else None)
        try:
            spark_net.fit(rdd, epochs=args.epochs)
        finally:
            spark_net.delete_temp_files()
        used = {
            "startup_seconds": started - start,
            "fit_seconds": time.time() - started,
            "spark_master": spark.sparkContext.master,
            "master": master.to_dict(),
        }
        return spark_net.training_stats, spark_net.score, used


def connect_progress(args: argparse.Namespace) -> dict[str, Any]:
    """``SparkNetwork``'s progress settings for ``--progress-directory URL``: the ``"directory"`` channel under
    ``URL`` (the workers write files this command polls, whether or not they could reach it), or none (the
    session's default, ``"auto"``). Only a Connect session takes them
    (`torchspark.cli_checks.check_session_options` refuses the flag on the other routes)."""
    if args.progress_directory is None:
        return {}
    return {"progress_channel": "directory", "progress_directory": args.progress_directory}


@contextlib.contextmanager
def train_session(args: argparse.Namespace) -> Iterator[tuple[Any, str]]:
    """``train``'s session and where it runs: the server at ``--remote``, a Connect server started here
    (``--connect``), or a classic session (``local[--num-workers]`` or ``--master``; the active one when there is
    one). A session this opens is stopped at the end."""
    from torchspark.spark import check_java, session_scope
    from torchspark.spark.session import local_session, remote_session

    if args.remote is None and not args.connect:
        check_java()
        with session_scope(cores=args.num_workers, master=args.master, quiet=not args.verbose) as spark:
            yield spark, spark.sparkContext.master
        return
    if args.remote is not None:
        spark, where = remote_session(args.remote), args.remote
    else:
        spark = local_session(cores=args.num_workers, master=args.master, quiet=not args.verbose, connect=True)
        where = f"connect:{args.master or f'local[{args.num_workers}]'}"
    try:
        yield spark, where
    finally:
        spark.stop()


def train_on_connect(
    args: argparse.Namespace, net: Any, train_data: Any, master: Any
) -> tuple[Any, float, dict[str, Any]]:
    """`train_on_spark` through a Spark Connect session: a local Connect server (``--connect``) or the
    server at ``--remote``; the digits go to the workers as a DataFrame."""
    from torchspark.spark import SparkNetwork

    start = time.time()
    with train_session(args) as (spark, where):
        started = time.time()
        frame = digits_frame(spark, "train")
        spark_net = SparkNetwork(
            spark, net, master, progress=False if args.no_progress else None, **connect_progress(args)
        )
        spark_net.fit(frame, epochs=args.epochs, feature_shape=tuple(train_data.features.shape[1:]))
        used = {
            "startup_seconds": started - start,
            "fit_seconds": time.time() - started,
            "spark_master": where,
            "master": master.to_dict(),
        }
        return spark_net.training_stats, spark_net.score, used
