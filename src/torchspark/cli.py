"""The ``torchspark`` command: train, evaluate and predict with Spark (or ParallelWrapper) from the shell.

``torchspark train`` trains a zoo model on a built-in dataset or on your own data (``--data``: a Parquet path or a
catalog table, `torchspark.cli_data`; gradient sharing by default, as DL4J's guidance recommends) and writes the model, ``metrics.json`` (on Spark also the ``spark_master`` and ``master`` settings it
used), ``stats.json`` and the ``stats.html`` timeline; ``evaluate``/``predict``: distributed evaluation and inference.
The exit codes (0 done, 1 runtime failure, 2 usage error, 130 interrupted) are `torchspark.cli_exit`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from torchspark.cli_args import version_line
from torchspark.cli_checks import check_arguments
from torchspark.cli_exit import EXIT_INTERRUPTED, EXIT_OK, exit_code
from torchspark.cli_limits import check_scale, save_model
from torchspark.cli_parser import DATASET_MODELS, LOG_LEVELS, MODELS, build_parser
from torchspark.cli_spark import digits_frame, train_on_spark
from torchspark.errors import ConfigError, SetupError, TorchSparkError
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS
from torchspark.training.config import master_class

__all__ = ["main", "build_parser", "version_line"]

log = logging.getLogger("torchspark.cli")


# ------------------------------------------------------------------ helpers
def _updater(name: str, lr: float) -> Any:
    from torchspark.optim import UPDATERS

    return UPDATERS[name](lr=lr)  # type: ignore[call-arg]


def _own_model(args: argparse.Namespace) -> Any:
    """The module ``--model pkg.mod:factory`` names, called with ``--model-kwargs`` (imported only with
    ``--trust-code``)."""
    from torchspark.nn.network_spec import resolve_factory

    factory = resolve_factory(
        args.model,
        trust_code=args.trust_code,
        owner="--model",
        fix="pass --trust-code to let torchspark import and run it (only code you trust), or --model one of "
        + ", ".join(MODELS),
    )
    try:
        module = factory(**(args.model_kwargs or {}))
    except TypeError as e:
        raise ConfigError(
            f"--model {args.model} refused --model-kwargs {args.model_kwargs or {}}: {e}; pass its arguments "
            "as --model-kwargs '{\"name\": value}'"
        ) from e
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"--model {args.model} returned {type(module).__name__}, expected a torch.nn.Module")
    return module


def _model(name: str, sample_shape: Sequence[int], n_classes: int) -> Any:
    from torchspark import models

    if name == "text_transformer":  # keywords: (seq_len,) token ids from a 20,000-token vocabulary
        return models.text_transformer(20000, n_classes, max_len=sample_shape[0])
    if name == "mlp":
        return models.mlp(math.prod(sample_shape), 128, n_classes)
    if len(sample_shape) != 3:
        raise ConfigError(
            f"--model {name} takes images, but each example has shape {tuple(sample_shape)}; pass --feature-shape "
            "C,H,W (e.g. 1,28,28) or train --model mlp"
        )
    c, h, w = sample_shape
    if name == "lenet":
        return models.lenet(c, n_classes, h, w)
    if name == "vgg":
        return models.vgg(c, n_classes)
    raise ConfigError(f"--model {name!r} is not a model of train; use one of lenet, mlp, vgg, text_transformer")


def _train_test(args: argparse.Namespace) -> tuple[Any, Any]:
    """The ``--dataset``'s training and test splits; ConfigError when ``--model`` cannot take its examples."""
    from torchspark import datasets
    from torchspark.data import DataSet

    if args.model in MODELS and args.model not in DATASET_MODELS[args.dataset]:
        takes = next(d for d, names in DATASET_MODELS.items() if args.model in names)
        raise ConfigError(
            f"--model {args.model} does not take the examples of --dataset {args.dataset}; use "
            f"--dataset {takes}, or one of {list(DATASET_MODELS[args.dataset])} as --model"
        )
    if args.dataset == "digits":
        return datasets.digits("train"), datasets.digits("test")
    both = datasets.synthetic_keywords(2560, seed=args.seed)  # one task (the same keywords), split 2048 / 512
    x, y = both.features, both.labels
    assert y is not None  # synthetic_keywords is labelled
    return DataSet(x[:2048].clone(), y[:2048].clone()), DataSet(x[2048:].clone(), y[2048:].clone())


def _write_json(path: str, obj: Any) -> None:
    from torchspark._io import atomic_write_bytes

    # checked writable before the run (cli_checks): failing now is the environment's (a full disk), exit code 1
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode("utf-8"), SetupError)


def _load_model(path: str, trust_code: bool = False) -> Any:
    from torchspark import Network

    if not os.path.isdir(path):
        raise ConfigError(
            f"--model {path!r} is not a directory; pass the directory written by `torchspark train` "
            "(OUTPUT/model) or Network.save"
        )
    return Network.load(path, trust_code=trust_code)


def _digits_split(spec: str) -> str | None:
    if spec.startswith("digits"):
        split = spec.partition(":")[2] or "test"
        if split not in ("train", "test"):
            raise ConfigError(f"--data {spec!r}: the digits splits are digits:train and digits:test")
        return split
    return None


def _data_for_evaluation(spark: Any, args: argparse.Namespace) -> Any:
    """An RDD of DataSets, a list of batch-file paths, or a DataFrame."""
    from torchspark import datasets

    split = _digits_split(args.data)
    if split is not None:
        return spark.sparkContext.parallelize(datasets.digits(split).split(args.batch_size), args.num_workers)
    batch_files = _batch_files(args.data)
    if batch_files:
        return batch_files
    return _read_parquet(spark, args.data)


def _batch_files(spec: str) -> list[str]:
    pattern = os.path.join(spec, "*.safetensors") if os.path.isdir(spec) else spec
    return sorted(glob.glob(pattern)) if pattern.endswith(".safetensors") else []


def _read_parquet(spark: Any, path: str) -> Any:
    from torchspark.spark.predict import read_parquet

    if not os.path.exists(path) and "://" not in path:
        raise ConfigError(
            f"--data {path!r} does not exist; pass digits:test, a directory of batch files or a Parquet path"
        )
    return read_parquet(spark, path)


# ------------------------------------------------------------------ commands
def _network(args: argparse.Namespace, sample_shape: Sequence[int], n_classes: int, own: Any = None) -> Any:
    """The network of ``own`` (the module ``--model pkg.mod:factory`` built) or of the zoo ``--model`` for examples
    of ``sample_shape`` and ``n_classes`` classes, with the network options."""
    from torchspark import Network

    return Network(
        own if own is not None else _model(args.model, tuple(sample_shape), n_classes),
        updater=_updater(args.updater, args.lr),
        seed=args.seed,
        memory_format=args.memory_format,
        precision=args.precision,
        compile=args.compile,
    )


def cmd_train(args: argparse.Namespace) -> int:
    from torchspark.encoding import AdaptiveThreshold

    if args.model_kwargs is not None and args.model in MODELS:
        raise ConfigError(
            f"--model-kwargs is for a --model pkg.mod:factory of yours; the zoo's --model {args.model} is sized "
            "from the dataset: drop --model-kwargs"
        )
    own = _own_model(args) if args.model not in MODELS else None  # refused before the data is read
    master = master_from_args(args, AdaptiveThreshold(initial=args.threshold_algorithm))
    if args.data is not None:
        return _train_user_data(args, master, own)
    train_data, test_data = _train_test(args)
    net = _network(args, tuple(train_data.features.shape[1:]), int(train_data.labels.max()) + 1, own)
    start = time.time()
    if args.parallel:
        from torchspark.parallel import ParallelWrapper

        wrapper = ParallelWrapper(net, master=master, progress=not args.no_progress)
        wrapper.fit(train_data, epochs=args.epochs)
        stats, score, runner = wrapper.training_stats, wrapper.score, "ParallelWrapper"
        used: dict[str, Any] = {"startup_seconds": 0.0, "fit_seconds": time.time() - start}
    else:
        _spark()  # without pyspark: a SetupError that says what to install
        stats, score, used = train_on_spark(args, net, train_data, master)
        runner = "SparkNetwork"
    seconds = time.time() - start
    evaluation = net.evaluate(test_data)
    trained = _Trained(net, evaluation, stats, score, runner, seconds, len(train_data), len(test_data), used)
    return _report(args, trained, f"test {args.dataset}")


def _train_user_data(args: argparse.Namespace, master: Any, own: Any = None) -> int:
    """``train --data``: read, train and evaluate on the session (`torchspark.cli_data`)."""
    from torchspark.cli_data import fit_user_data, user_data
    from torchspark.cli_spark import connect_progress, train_session

    _spark()
    start = time.time()
    with train_session(args) as (spark, where):
        started = time.time()
        data = user_data(spark, args)
        spark_net, evaluation = fit_user_data(
            spark, args, data, lambda shape, k: _network(args, shape, k, own), master, connect_progress(args)
        )
        used = {
            "startup_seconds": started - start,
            "fit_seconds": time.time() - started,
            "spark_master": where,
            "master": master.to_dict(),
            "data": args.data,
            "sample_shape": list(data.sample_shape),
            "num_classes": data.n_classes,
        }
    trained = _Trained(
        spark_net.network,
        evaluation,
        spark_net.training_stats,
        spark_net.score,
        "SparkNetwork",
        time.time() - start,
        data.n_train,
        data.n_test,
        used,
    )
    return _report(args, trained, "test rows" if args.test_data is None else f"rows of {args.test_data}")


@dataclasses.dataclass(frozen=True)
class _Trained:
    """What a ``train`` run produced, for `_report`."""

    net: Any
    evaluation: Any
    stats: Any
    score: float
    runner: str
    seconds: float
    n_train: int
    n_test: int
    used: dict[str, Any]


def _report(args: argparse.Namespace, t: _Trained, tested_on: str) -> int:
    """Print the evaluation and write the model, metrics.json, stats.json and stats.html to ``--output``."""
    evaluation = t.evaluation
    print(evaluation.stats())
    model_dir = os.path.join(args.output, "model")
    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError:
        pass  # save_model says where the model went instead
    save_model(t.net, model_dir)
    summary = t.stats.summary() if t.stats is not None else {}
    metrics: dict[str, Any] = {
        "accuracy": evaluation.accuracy(),
        "f1_macro": evaluation.f1(average="macro"),
        "score": t.score,
        "epochs": args.epochs,
        "num_workers": args.num_workers,
        "training_mode": args.training_mode,
        "runner": t.runner,
        "train_seconds": t.seconds,
        "precision": args.precision,
        "train_examples": t.n_train,
        "test_examples": t.n_test,
        # training throughput: the fit alone, not the Spark session's start (startup_seconds)
        "examples_per_second": t.n_train * args.epochs / t.used["fit_seconds"],
        **{k: summary[k] for k in ("bytes_sent", "dense_bytes", "replicas_identical") if k in summary},
        **t.used,
    }
    _write_json(os.path.join(args.output, "metrics.json"), metrics)
    written = [model_dir, os.path.join(args.output, "metrics.json")]
    if t.stats is not None:
        _write_json(os.path.join(args.output, "stats.json"), json.loads(t.stats.to_json()))
        t.stats.export_html(os.path.join(args.output, "stats.html"))
        written += [os.path.join(args.output, "stats.json"), os.path.join(args.output, "stats.html")]
    print(
        f"accuracy {evaluation.accuracy():.4f} on {t.n_test} {tested_on} ({args.training_mode}, {t.runner}); wrote "
        + ", ".join(written)
    )
    return 0


def master_from_args(args: argparse.Namespace, threshold: Any) -> Any:
    """The master ``--training-mode`` names, with the options of the command line (the same on Spark and with
    ``--parallel``)."""
    common = dict(
        batch_size_per_worker=args.batch_size_per_worker,
        num_workers=args.num_workers,
        rng_seed=args.seed,
        collect_training_stats=True,
        accumulate_steps=args.accumulate_steps,
        shuffle_scope=args.shuffle_scope,
        gpus_per_worker=args.gpus_per_worker,
    )
    # each kind takes its own options: the base class's signature does not name them
    make: Any = master_class("sharing" if args.training_mode == "sharing" else "averaging")
    if args.training_mode == "sharing":
        return make(threshold_algorithm=threshold, **_sharing_options(args), **common)
    return make(averaging_frequency=args.averaging_frequency, **common)


def _sharing_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--topology``, ``--shard-above-workers`` and ``--max-staleness`` for the sharing master (nothing in averaging
    mode, where `check_mode_options` refused them)."""
    if args.training_mode != "sharing":
        return {}
    return {
        "topology": args.topology,
        "shard_above_workers": args.shard_above_workers,
        "max_staleness": args.max_staleness,
    }


def check_mode_options(args: argparse.Namespace) -> None:
    """Sharing-only options with ``--training-mode averaging`` (and ``--shard-above-workers`` with a fixed ``--topology``) are
    a mistake, not something to ignore silently."""
    if getattr(args, "command", None) != "train":
        return
    if args.training_mode == "sharing":
        if args.topology != "auto" and args.shard_above_workers != DEFAULT_SHARD_ABOVE_WORKERS:
            raise ConfigError(
                f"--shard-above-workers {args.shard_above_workers} applies to --topology auto only, but "
                f"--topology is {args.topology!r}; use --topology auto or drop --shard-above-workers"
            )
        return
    for option, value, default in (
        ("--topology", args.topology, "auto"),
        ("--shard-above-workers", args.shard_above_workers, DEFAULT_SHARD_ABOVE_WORKERS),
        ("--max-staleness", args.max_staleness, None),
    ):
        if value != default:
            raise ConfigError(
                f"{option} {value} applies to gradient sharing only, but --training-mode is {args.training_mode!r}; "
                f"use --training-mode sharing or drop {option}"
            )


def _spark() -> Any:
    """[`torchspark.spark`][torchspark.spark], imported when a command takes a Spark route; without pyspark a SetupError that says
    what to install (``train --parallel`` and ``advise`` need no Spark)."""
    try:
        import torchspark.spark as spark
    except ImportError as e:
        if e.name not in ("pyspark", "py4j"):
            raise
        raise SetupError(str(e)) from e
    return spark


def cmd_evaluate(args: argparse.Namespace) -> int:
    api = _spark()
    net = _load_model(args.model, args.trust_code)
    api.check_java()
    with api.session_scope(cores=args.num_workers, master=args.master, quiet=not args.verbose) as spark:
        data = _data_for_evaluation(spark, args)
        evaluation = api.SparkNetwork(spark, net).evaluate(
            data,
            batch_size=args.batch_size,
            features_col=args.features_col,
            label_col=args.label_col,
            feature_shape=args.feature_shape,
        )
    print(evaluation.stats())
    if args.output:
        _write_json(args.output, json.loads(evaluation.to_json()))
        print(f"evaluation written to {args.output}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    api = _spark()
    net = _load_model(args.model, args.trust_code)
    api.check_java()
    with api.session_scope(cores=args.num_workers, master=args.master, quiet=not args.verbose) as spark:
        split = _digits_split(args.data)
        frame = digits_frame(spark, split) if split is not None else _read_parquet(spark, args.data)
        shape = args.feature_shape or ((1, 8, 8) if split is not None else None)
        if args.features_col not in frame.columns:
            raise ConfigError(
                f"--features-col {args.features_col!r} is not a column of {args.data!r} (columns: {frame.columns})"
            )
        out = api.SparkNetwork(spark, net).predict(
            frame,
            features_col=args.features_col,
            output_col=args.output_col,
            feature_shape=shape,
            batch_size=args.batch_size,
            output="class" if args.as_class else "probabilities",
            non_finite=args.non_finite,
        )
        _write_predictions(out, args.output, args.overwrite)
        rows = spark.read.parquet(args.output).count()
    print(f"wrote {rows} rows with column {args.output_col!r} to {args.output}")
    return 0


def _write_predictions(frame: Any, output: str, overwrite: bool) -> None:
    """Write ``frame`` as Parquet to ``output`` without deleting anything this command did not write: a local path
    through a temporary sibling renamed into place (`torchspark.cli_output.write_directory`); a URL
    (``hdfs://``, ``s3a://``) directly, refused by Spark when it exists unless ``overwrite``."""
    from torchspark.cli_output import write_directory
    from torchspark.spark.predict import write_parquet

    if "://" in output and not output.startswith("file://"):
        write_parquet(frame, output, "overwrite" if overwrite else "errorifexists")
        return
    write_directory(output, overwrite, lambda tmp: write_parquet(frame, tmp))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line with its ``--config`` file's settings under it (any subcommand:
    [`torchspark.config_files.parse_with_config`][torchspark.config_files.parse_with_config])."""
    from torchspark.config_files import parse_with_config

    return parse_with_config(parser, None if argv is None else list(argv))


def log_level(args: argparse.Namespace) -> int:
    """The logging level ``-v``/``--verbose`` (info), ``-q``/``--quiet`` (error) or ``--log-level`` ask for
    (warning by default).

    Raises:
        ConfigError: more than one of them (a ``--config`` file setting two; argparse refuses two on the command
            line).
    """
    chosen = [
        f"{flag} {value}" if flag == "--log-level" else flag
        for flag, value in (
            ("--verbose", getattr(args, "verbose", False)),
            ("--quiet", getattr(args, "quiet", False)),
            ("--log-level", getattr(args, "log_level", None)),
        )
        if value
    ]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} set the same thing (how much is logged); use one of them")
    level = getattr(args, "log_level", None)
    if level is not None:
        if level not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {list(LOG_LEVELS)}, got {level!r}")
        return int(getattr(logging, level.upper()))
    if getattr(args, "quiet", False):
        return logging.ERROR
    return logging.INFO if getattr(args, "verbose", False) else logging.WARNING


def cmd_advise(args: argparse.Namespace) -> int:
    from torchspark.advise.command import cmd_advise as run

    return run(args)


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "predict": cmd_predict, "advise": cmd_advise}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchspark`` command; returns its exit code (`torchspark.cli_exit`): 0 done, 1 a runtime
    failure, 2 a usage error (argparse's own errors raise SystemExit(2)), 130 interrupted. An error is printed as
    ``torchspark: error: MESSAGE`` on stderr."""
    parser = build_parser()
    try:
        args = _parse(parser, argv)
        level = log_level(args)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        if getattr(args, "print_config", None):
            from torchspark.config_files import dump_mapping, train_settings

            print(dump_mapping(train_settings(parser, args), args.print_config), end="")
            return EXIT_OK
        args.verbose = level <= logging.INFO  # the JVM's own log too
        if getattr(args, "quiet", False) and hasattr(args, "no_progress"):
            args.no_progress = True
        check_mode_options(args)
        check_scale(args)
        check_arguments(args)  # outputs and master first: fail in a second, not after training
        return COMMANDS[args.command](args)
    except TorchSparkError as e:
        print(f"torchspark: error: {e}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("torchspark: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
