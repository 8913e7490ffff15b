"""The ``torchspark`` command's parser: every subcommand and option, with its help (the site's CLI reference is
generated from it: docs/hooks/cli_page.py).

A new ``train`` option is one ``add_argument`` here, read where the command builds the master
(`torchspark.cli.master_from_args`) or the session (`torchspark.cli_spark`), checked before anything
starts (`torchspark.cli_checks`); ``--config`` files and ``--print-config`` pick it up by its name.
"""

from __future__ import annotations

import argparse
from typing import Any

from torchspark.cli_args import (
    json_object,
    non_negative_int,
    positive_float,
    positive_int,
    shape,
    threshold,
    version_line,
)
from torchspark.cli_checks import compile_setting
from torchspark.nn.precision import PRECISIONS
from torchspark.optim import UPDATERS as optim_updaters
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS
from torchspark.training.config import master_kinds
from torchspark.training.config.masters import SHUFFLE_SCOPES

__all__ = ["build_parser", "DATASET_MODELS", "MODELS", "UPDATERS", "LOG_LEVELS"]

MODELS = ("lenet", "mlp", "vgg", "text_transformer")
#: --dataset -> the models that take its examples (images: the convolutional and dense ones; tokens: the transformer)
DATASET_MODELS = {"digits": ("lenet", "mlp", "vgg"), "keywords": ("text_transformer",)}
#: --updater's choices: the updater registry's names (torchspark.optim.UPDATERS), the default first
UPDATERS = ("adam", *sorted(set(optim_updaters) - {"adam"}))


def model_choice(text: str) -> str:
    """An argparse type: a zoo model name (`MODELS`) or an import path ``"pkg.mod:factory"``."""
    from torchspark.nn.network_spec import is_import_path

    if text in MODELS or is_import_path(text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(MODELS)}, or your own module class or factory as "
        "'pkg.mod:factory' with --trust-code)"
    )


def _add_spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default local[WORKERS]); e.g. local-cluster[2,1,1024], spark://h:7077, yarn",
    )
    p.add_argument("--num-workers", type=positive_int, default=2, help="Spark task slots / training workers")


#: ``--log-level``'s choices, quietest last
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _add_logging_options(p: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose``, ``-q``/``--quiet`` and ``--log-level`` (one of them) on every subcommand."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what happens (--log-level info), and show the JVM's own start-up warnings and log (hidden otherwise)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="log errors only (--log-level error) and show no progress bar; the results are still printed",
    )
    group.add_argument(
        "--log-level",
        default=None,
        choices=LOG_LEVELS,
        help="the level of torchspark's log (default: warning); info and debug also show the JVM's own log",
    )


def _add_config_option(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"YAML (.yaml/.yml) or JSON file of {command} settings by option name (dashes or underscores); "
        "options on the command line override it",
    )


def _add_data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        default="digits:test",
        help="digits:test | digits:train | a directory or glob of batch files (.safetensors) | Parquet",
    )
    p.add_argument("--features-col", default="features", help="Parquet: features column (array or ML Vector)")
    p.add_argument("--label-col", default="label", help="Parquet: label column")
    p.add_argument("--feature-shape", type=shape, default=None, help="Parquet: reshape each row, e.g. 1,28,28")
    p.add_argument("--batch-size", type=positive_int, default=256, help="examples per forward pass on executors")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``torchspark`` and its subcommands (``train``, ``evaluate``, ``predict``, ``advise``)."""
    # no abbreviated flags (allow_abbrev=False): a renamed flag such as --threshold or --mode must be an error, not
    # silently read as a longer option it abbreviates (--threshold-algorithm, --model)
    parser = argparse.ArgumentParser(
        prog="torchspark", allow_abbrev=False, description="Distributed training of PyTorch networks on Apache Spark."
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    _add_train(sub, fmt)
    _add_evaluate(sub, fmt)
    _add_predict(sub, fmt)

    from torchspark.advise.command import add_parser as add_advise_parser

    add_advise_parser(sub, fmt, positive_int, positive_float, shape)
    advise = sub.choices["advise"]
    _add_config_option(advise, "advise")
    _add_logging_options(advise)
    return parser


def _add_train(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    train = sub.add_parser(
        "train",
        help="train a zoo model on a built-in dataset or your own data (--data)",
        formatter_class=fmt,
        allow_abbrev=False,
        description="Train a zoo model on a built-in dataset (--dataset) or on your own data (--data: a "
        "Parquet path or a catalog table) with Spark (or --parallel without Spark, built-in data only), print "
        "the evaluation on the test split, and write the model, metrics.json, stats.json and stats.html to "
        "--output.",
    )
    _add_run_options(train)
    _add_master_options(train)
    _add_network_options(train)
    _add_output_options(train)
    _add_spark_options(train)
    _add_logging_options(train)


def _add_run_options(train: argparse.ArgumentParser) -> None:
    """What to train and where: the dataset, the model, the epochs, the mode, and the route (Spark, Connect,
    local processes)."""
    train.add_argument(
        "--dataset",
        default="digits",
        choices=list(DATASET_MODELS),
        help="built-in training dataset: digits (8x8 images) or keywords (token sequences of "
        "datasets.synthetic_keywords, for --model text_transformer)",
    )
    train.add_argument(
        "--model",
        default="lenet",
        type=model_choice,
        metavar="{" + ",".join(MODELS) + "} or pkg.mod:factory",
        help="zoo model to train, or your own module class or factory 'pkg.mod:factory' (with --trust-code; "
        "called with --model-kwargs, it must take the dataset's examples: digits are (1, 8, 8) images of 10 "
        "classes, keywords (32,) int64 token ids of 2 classes)",
    )
    train.add_argument(
        "--trust-code",
        action="store_true",
        help="let --model name your own module class or factory (imports and calls it)",
    )
    train.add_argument(
        "--model-kwargs",
        type=json_object,
        default=None,
        metavar="JSON",
        help="keyword arguments of a --model pkg.mod:factory, as a JSON object (e.g. '{\"hidden\": 64}')",
    )
    _add_user_data_options(train)
    train.add_argument("--epochs", type=positive_int, default=8, help="passes over the training data")
    train.add_argument(
        "--training-mode",
        default="sharing",
        choices=master_kinds(),
        help="sharing: threshold-encoded gradient sharing; averaging: synchronous parameter averaging",
    )
    train.add_argument(
        "--parallel",
        action="store_true",
        help="train with ParallelWrapper (local worker processes), without Spark or Java",
    )
    train.add_argument(
        "--connect",
        action="store_true",
        help="train through a Spark Connect session of a Connect server started on this machine "
        "(with --master's cluster, default local[WORKERS]): the data as a DataFrame, one barrier "
        "mapInArrow stage; needs pip install 'torchspark[connect]'",
    )
    train.add_argument(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="train through the Spark Connect server at this URL (a client-only install is enough: "
        "pip install 'torchspark[connect]'; torch and torchspark must be on the executors)",
    )
    train.add_argument(
        "--progress-directory",
        default=None,
        metavar="URL",
        help="with --connect or --remote: the workers stream progress, heartbeats, scores and "
        "tracebacks as files under this URL (any fsspec URL every executor can write and this "
        "machine can read, e.g. s3://bucket/progress), which the command polls: for a client "
        "the executors cannot connect to (SparkNetwork's progress_channel='directory'); each fit "
        "uses a fresh subdirectory, removed when it succeeds",
    )


def _add_user_data_options(train: argparse.ArgumentParser) -> None:
    """``--data``: train on your own data instead of a built-in ``--dataset`` (`torchspark.cli_data`)."""
    train.add_argument(
        "--data",
        default=None,
        metavar="PATH|table:NAME",
        help="train on your own data: a Parquet file or directory (any URL Spark reads, e.g. s3a://bucket/train or "
        "/Volumes/catalog/schema/volume/train) or table:NAME, a table of the session's catalog; with "
        "--features-col, --label-col (class indices 0..K-1) and, for images, --feature-shape. Trains on Spark "
        "(not with --parallel)",
    )
    train.add_argument(
        "--test-data",
        default=None,
        metavar="PATH|table:NAME",
        help="with --data: evaluate on this data (same columns) instead of a held-out part of --data",
    )
    train.add_argument(
        "--test-fraction",
        type=positive_float,
        default=None,
        metavar="F",
        help="with --data: the part of --data held out for the evaluation, chosen with --seed (default 0.2)",
    )
    train.add_argument("--features-col", default="features", help="with --data: features column (array or ML Vector)")
    train.add_argument("--label-col", default="label", help="with --data: label column (class indices 0..K-1)")
    train.add_argument(
        "--feature-shape",
        type=shape,
        default=None,
        help="with --data: reshape each row, e.g. 1,28,28 (lenet and vgg need C,H,W; default: the row as a vector)",
    )
    train.add_argument(
        "--num-classes",
        type=positive_int,
        default=None,
        metavar="K",
        help="with --data: the number of classes (default: the largest label + 1)",
    )


def _add_master_options(train: argparse.ArgumentParser) -> None:
    """The training master's options (`torchspark.training.config`)."""
    train.add_argument("--batch-size-per-worker", type=positive_int, default=16, help="minibatch size per worker")
    train.add_argument(
        "--accumulate-steps",
        type=positive_int,
        default=1,
        metavar="K",
        help="minibatches per optimizer step (gradient accumulation: K x the minibatch per step)",
    )
    train.add_argument(
        "--averaging-frequency",
        type=positive_int,
        default=5,
        help="averaging mode: optimizer steps between parameter averages",
    )
    train.add_argument(
        "--threshold-algorithm",
        type=threshold,
        default="calibrated",
        help="sharing mode: the master's threshold_algorithm, an adaptive threshold starting at "
        "'calibrated' (default: chosen from the first update for ~1e-3 sparsity) or at a fixed "
        "value such as DL4J's 1e-4",
    )
    train.add_argument(
        "--topology",
        default="auto",
        choices=["auto", "all_gather", "sharded"],
        help="sharing mode: how the workers exchange their messages each step: all_gather (every "
        "worker receives every message), sharded (reduce-scatter by index shards, then "
        "all-gather: for many workers or dense messages), auto (sharded above 128 workers); "
        "see docs/scaling.md",
    )
    train.add_argument(
        "--shard-above-workers",
        type=positive_int,
        default=DEFAULT_SHARD_ABOVE_WORKERS,
        metavar="N",
        help="sharing mode: --topology auto shards when there are more than N workers; lower it for "
        "large (dense) messages, see docs/scaling.md",
    )
    train.add_argument(
        "--max-staleness",
        type=non_negative_int,
        default=None,
        metavar="K",
        help="sharing mode: bounded staleness: apply peers' updates as they arrive and wait only "
        "when more than K steps ahead of the slowest worker (default: synchronous exchange); "
        "helps when workers are slow at different times",
    )
    train.add_argument(
        "--shuffle-scope",
        default="worker",
        choices=list(SHUFFLE_SCOPES),
        help="what the per-epoch shuffle of --seed moves: worker (each worker reorders its own "
        "minibatches; no data moves) or global (the minibatches are dealt to the workers anew "
        "every epoch, as one machine's shuffled loader would: data moves between workers)",
    )
    train.add_argument(
        "--gpus-per-worker",
        type=positive_float,
        default=None,
        metavar="N",
        help="Spark only: GPUs each training task asks for, through a stage-level resource profile "
        "of the training stage alone (default: the session's own task resources); at most 0.5 "
        "or a whole number. Needs a cluster manager (--master spark://, yarn, k8s://, "
        "local-cluster[...]) whose executors own GPUs; not with --parallel, --connect or "
        "--remote",
    )


def _add_network_options(train: argparse.ArgumentParser) -> None:
    """The network's options: updater, learning rate, seed, memory layout, precision, compilation."""
    train.add_argument("--updater", default="adam", choices=UPDATERS, help="optimizer")
    train.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate")
    train.add_argument("--seed", type=int, default=0, help="seed for weights and data shuffling")
    train.add_argument(
        "--memory-format",
        default="contiguous",
        choices=["contiguous", "channels_last"],
        help="layout of convolution weights; channels_last trains CNNs faster on CPU",
    )
    train.add_argument(
        "--precision",
        default="fp32",
        choices=list(PRECISIONS),
        help="mixed precision of the forward pass: bf16 (CPUs, recent GPUs), fp16 (older GPUs)",
    )
    train.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        type=compile_setting,
        metavar="BACKEND",
        help="torch.compile the forward pass (default backend, or aot_eager, max-autotune, ...)",
    )


def _add_output_options(train: argparse.ArgumentParser) -> None:
    """Where the results go, the progress bar, and the settings files."""
    train.add_argument("--output", default="torchspark-output", help="directory for the model, metrics and stats")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML (.yaml/.yml) or JSON file of train settings by option name (epochs: 4, training_mode: "
        "averaging, ...); options on the command line override it",
    )
    train.add_argument(
        "--print-config",
        nargs="?",
        const="yaml",
        default=None,
        choices=["yaml", "json"],
        help="print the settings this command would train with (YAML, or json) and exit: the start of a --config file",
    )


def _add_evaluate(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    evaluate = sub.add_parser(
        "evaluate",
        help="evaluate a saved model on the cluster",
        formatter_class=fmt,
        allow_abbrev=False,
        description="Distributed evaluation of a saved model (SparkNetwork.evaluate).",
    )
    evaluate.add_argument("--model", required=True, help="directory written by Network.save / torchspark train")
    evaluate.add_argument(
        "--trust-code",
        action="store_true",
        help="let the model's config.json name your own module class, factory or loss (imports it)",
    )
    _add_data_options(evaluate)
    evaluate.add_argument("--output", default=None, help="also write the evaluation as JSON to this file")
    _add_config_option(evaluate, "evaluate")
    _add_spark_options(evaluate)
    _add_logging_options(evaluate)


def _add_predict(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    predict = sub.add_parser(
        "predict",
        help="add a prediction column to Parquet data",
        formatter_class=fmt,
        allow_abbrev=False,
        description="Distributed inference of a saved model (SparkNetwork.predict): read "
        "Parquet (or digits:test), add the prediction column, write Parquet.",
    )
    predict.add_argument("--model", required=True, help="directory written by Network.save / torchspark train")
    predict.add_argument(
        "--trust-code",
        action="store_true",
        help="let the model's config.json name your own module class, factory or loss (imports it)",
    )
    _add_data_options(predict)
    predict.add_argument(
        "--output",
        required=True,
        help="Parquet directory to write (written to a temporary sibling, then renamed into place); an existing "
        "non-empty directory is refused unless --overwrite",
    )
    predict.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output directory and everything in it (never one that is, holds or lies "
        "inside --data, --model or the working directory)",
    )
    predict.add_argument("--output-col", default="prediction", help="name of the new column")
    predict.add_argument(
        "--class",
        dest="as_class",
        action="store_true",
        help="write the predicted class index instead of the output probabilities",
    )
    predict.add_argument(
        "--non-finite",
        choices=("error", "null"),
        default="error",
        help="a row with NaN or inf features: fail naming it (error), or write a null prediction for it (null)",
    )
    _add_config_option(predict, "predict")
    _add_spark_options(predict)
    _add_logging_options(predict)
