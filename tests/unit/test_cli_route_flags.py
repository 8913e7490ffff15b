"""``train --shuffle-scope``, ``--gpus-per-worker`` and ``--progress-directory``: each reaches what the Python API
sets (the master, ``SparkNetwork``'s progress settings), and a flag its route cannot honour exits 2 before anything
starts, with one line naming the flag, the value and the fix. (``--progress-directory`` on a real Connect session:
tests/connect/test_connect_cli.py.)"""

from __future__ import annotations

import pytest

from torchspark import cli
from torchspark.cli import build_parser, master_from_args
from torchspark.cli_spark import connect_progress
from torchspark.config_files import train_settings
from torchspark.encoding import AdaptiveThreshold
from torchspark.errors import ConfigError


@pytest.mark.parametrize("mode", ["sharing", "averaging"])
def test_shuffle_scope_and_gpus_per_worker_reach_the_master(mode: str) -> None:
    parse = build_parser().parse_args
    default = master_from_args(parse(["train", "--training-mode", mode]), AdaptiveThreshold())
    assert (default.shuffle_scope, default.gpus_per_worker) == ("worker", None)
    args = parse(["train", "--training-mode", mode, "--shuffle-scope", "global", "--gpus-per-worker", "1"])
    master = master_from_args(args, AdaptiveThreshold())
    assert (master.shuffle_scope, master.gpus_per_worker) == ("global", 1.0)
    assert master.to_dict()["shuffle_scope"] == "global"  # what metrics.json records as the master's settings


def test_progress_directory_becomes_the_directory_channel_of_the_connect_session(tmp_path) -> None:
    parse = build_parser().parse_args
    assert connect_progress(parse(["train", "--connect"])) == {}  # the session's own default ("auto")
    args = parse(["train", "--remote", "sc://h:15002", "--progress-directory", str(tmp_path)])
    assert connect_progress(args) == {"progress_channel": "directory", "progress_directory": str(tmp_path)}


def test_the_new_flags_round_trip_through_a_config_file() -> None:
    parser = build_parser()
    args = parser.parse_args(["train", "--shuffle-scope", "global", "--gpus-per-worker", "0.5"])
    settings = train_settings(parser, args)
    assert (settings["shuffle_scope"], settings["gpus_per_worker"], settings["progress_directory"]) == (
        "global",
        0.5,
        None,
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["--progress-directory", "{tmp}/p"],
            "applies to a Spark Connect session only (--connect or --remote): with a classic",
        ),
        (["--parallel", "--progress-directory", "{tmp}/p"], "with --parallel's local processes"),
        (
            ["--gpus-per-worker", "1"],
            "--gpus-per-worker 1 needs stage-level scheduling, which Spark does not offer in local mode (--master local[2])",
        ),
        (["--gpus-per-worker", "1", "--master", "local[3]"], "(--master local[3])"),
        (
            ["--gpus-per-worker", "2", "--parallel"],
            "--gpus-per-worker 2 asks Spark for GPUs per training task, but --parallel",
        ),
        (
            ["--gpus-per-worker", "0.5", "--connect"],
            "--gpus-per-worker 0.5 asks a stage-level resource profile, which the Spark Connect route",
        ),
    ],
    ids=["directory-classic", "directory-parallel", "gpus-local", "gpus-local-master", "gpus-parallel", "gpus-connect"],
)
def test_a_flag_its_route_cannot_honour_exits_2_before_working(
    argv: list[str], fragment: str, tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(cli, "COMMANDS", {k: (lambda args, k=k: started.append(k) or 0) for k in cli.COMMANDS})
    full = ["train", *[a.format(tmp=tmp_path) for a in argv], "--output", str(tmp_path / "out")]
    assert cli.main(full) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: ") and err.count("\n") == 1
    assert fragment in err
    assert started == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--shuffle-scope", "everywhere"], "argument --shuffle-scope: invalid choice: 'everywhere'"),
        (["--gpus-per-worker", "0"], "argument --gpus-per-worker:"),
        (["--gpus-per-worker", "many"], "argument --gpus-per-worker:"),
    ],
)
def test_bad_values_are_refused_by_the_parser(argv: list[str], fragment: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["train", *argv])
    assert exc.value.code == 2 and fragment in capsys.readouterr().err


def test_a_gpu_amount_spark_cannot_schedule_is_refused_by_the_master() -> None:
    """0.75 GPU per task is neither <= 0.5 nor whole: the master's own check names it (on a cluster master)."""
    args = build_parser().parse_args(["train", "--gpus-per-worker", "0.75"])
    with pytest.raises(ConfigError, match="gpus_per_worker must be at most 0.5 or a whole number"):
        master_from_args(args, AdaptiveThreshold())


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--test-fraction", "0.3"], "--test-fraction applies to your own data only; add --data"),
        (["--test-data", "t.parquet"], "--test-data applies to your own data only"),
        (["--num-classes", "4"], "--num-classes applies to your own data only"),
        (["--data", "x.parquet", "--dataset", "keywords"], "--data 'x.parquet' and --dataset keywords both name"),
        (["--data", "x.parquet", "--parallel"], "--parallel trains local processes without Spark; drop --parallel"),
        (["--data", "x.parquet", "--model", "text_transformer"], "--model text_transformer takes token ids"),
        (["--data", "x", "--test-data", "y", "--test-fraction", "0.1"], "--test-fraction 0.1 holds out part"),
        (["--data", "x.parquet", "--test-fraction", "1.5"], "--test-fraction 1.5 must lie between 0 and 1"),
    ],
    ids=["fraction", "test-data", "classes", "dataset", "parallel", "transformer", "both-tests", "fraction-range"],
)
def test_train_data_options_that_cannot_work_exit_2_before_working(
    argv: list[str], fragment: str, tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(cli, "COMMANDS", {k: (lambda args, k=k: started.append(k) or 0) for k in cli.COMMANDS})
    assert cli.main(["train", *argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: ") and err.count("\n") == 1 and fragment in err, err
    assert started == []


def test_train_data_options_round_trip_through_a_config_file() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["train", "--data", "table:main.ml.digits", "--num-classes", "10", "--test-fraction", "0.1"]
    )
    settings = train_settings(parser, args)
    assert (settings["data"], settings["num_classes"], settings["test_fraction"]) == ("table:main.ml.digits", 10, 0.1)
