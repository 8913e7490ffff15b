"""CLI parsing and validation (no Spark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchspark.cli import build_parser, main


def test_defaults_train_with_gradient_sharing_on_spark() -> None:
    args = build_parser().parse_args(["train"])
    assert args.training_mode == "sharing" and not args.parallel
    assert args.threshold_algorithm == "calibrated" and args.num_workers == 2 and args.epochs == 8
    assert build_parser().parse_args(["train", "--threshold-algorithm", "1e-4"]).threshold_algorithm == 1e-4  # DL4J's


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--num-workers", "0"], "--num-workers: must be >= 1, got 0"),
        (["train", "--epochs", "two"], "--epochs: 'two' is not an integer"),
        (["train", "--lr", "-1"], "--lr: must be > 0"),
        (["train", "--threshold-algorithm", "auto"], "'auto' is not a number; use 'calibrated'"),
        (["train", "--training-mode", "sync"], "invalid choice: 'sync'"),
        (["train", "--memory-format", "nhwc"], "invalid choice: 'nhwc'"),
        (["train", "--max-staleness", "-1"], "--max-staleness: must be >= 0, got -1"),
        (["train", "--max-staleness", "two"], "--max-staleness: 'two' is not an integer"),
        (["train", "--topology", "ring"], "invalid choice: 'ring'"),
        (["train", "--shard-above-workers", "0"], "--shard-above-workers: must be >= 1, got 0"),
        (["evaluate", "--model", "m", "--feature-shape", "1,a"], "is not a shape such as 1,28,28"),
        (["predict", "--model", "m"], "--output"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--workers", "2"],  # --num-workers
        ["train", "--mode", "averaging"],  # --training-mode (no longer read as an abbreviation of --model)
        ["train", "--threshold", "1e-4"],  # --threshold-algorithm (no abbreviations: the old name is no alias)
        ["train", "--epoch", "2"],  # abbreviations of any flag are refused
        ["advise", "--workers", "4"],
    ],
)
def test_old_flag_names_are_refused(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert f"unrecognized arguments: {argv[1]}" in capsys.readouterr().err


def test_missing_model_directory_is_a_one_line_error(tmp_path, capsys) -> None:
    assert main(["evaluate", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: --model") and "Traceback" not in err


_NO_SPARK = """
import json, sys
from torchspark.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "pyspark": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j"))}))
"""


@pytest.mark.timeout(900)  # a full `torchspark train --parallel` in a child process (its own limit is 600 s)
def test_parallel_training_runs_parallelwrapper_without_starting_spark(tmp_path) -> None:
    """In a fresh interpreter (this one may have imported pyspark for other tests): ``--parallel`` trains with
    ParallelWrapper's 2 worker processes and never imports pyspark or py4j, so no JVM can have started."""
    out = tmp_path / "par"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _NO_SPARK,
            "train",
            "--parallel",
            "--num-workers",
            "2",
            "--training-mode",
            "averaging",
            "--epochs",
            "1",
            "--no-progress",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"rc": 0, "pyspark": []}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["runner"] == "ParallelWrapper" and metrics["num_workers"] == 2
    assert "spark_master" not in metrics and metrics["accuracy"] > 0.5
    stats = json.loads((out / "stats.json").read_text())
    assert sorted(w for w in stats["workers"] if w != "driver") == ["worker-0", "worker-1"]
    for name in ("stats.html", "model"):
        assert (out / name).exists(), name


def test_memory_format_reaches_the_saved_network(tmp_path) -> None:
    from torchspark import Network

    out = tmp_path / "cl"
    assert (
        main(
            [
                "train",
                "--parallel",
                "--training-mode",
                "averaging",
                "--epochs",
                "1",
                "--no-progress",
                "--memory-format",
                "channels_last",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert Network.load(str(out / "model")).memory_format == "channels_last"


@pytest.mark.parametrize(
    ("option", "value"), [("--max-staleness", "1"), ("--topology", "sharded"), ("--shard-above-workers", "4")]
)
def test_sharing_options_with_averaging_mode_are_refused(option: str, value: str, tmp_path, capsys) -> None:
    assert (
        main(["train", "--parallel", "--training-mode", "averaging", option, value, "--output", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert f"{option} {value} applies to gradient sharing only" in err and "--training-mode sharing" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--max-staleness", "2"], {"sharing.max_staleness": 2}),
        (["--topology", "sharded"], {"sharing.topology": "sharded"}),  # 2 workers: "auto" would pick all_gather
        (["--shard-above-workers", "1"], {"sharing.topology": "sharded"}),  # "auto" with 2 workers > 1
    ],
)
def test_sharing_options_reach_the_training(options: list[str], expected: dict, tmp_path) -> None:
    """--max-staleness and --topology train with the bounded-staleness loop / the sharded exchange: the saved
    network's extra_config says which ran (absent or different when the option is ignored)."""
    from torchspark import Network

    out = tmp_path / "run"
    assert (
        main(
            ["train", "--parallel", "--model", "mlp", "--epochs", "1", "--no-progress", *options, "--output", str(out)]
        )
        == 0
    )
    config = Network.load(str(out / "model")).extra_config
    assert {k: config.get(k) for k in expected} == expected, config


@pytest.mark.parametrize("topology", ["sharded", "all_gather"])
def test_shard_above_workers_with_a_fixed_topology_is_refused(topology: str, tmp_path, capsys) -> None:
    """Only ``--topology auto`` reads the worker count; with a fixed topology the option would be ignored."""
    assert (
        main(
            [
                "train",
                "--parallel",
                "--topology",
                topology,
                "--shard-above-workers",
                "4",
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--shard-above-workers 4 applies to --topology auto only" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_bounded_staleness_with_the_sharded_topology_is_a_one_line_error(tmp_path, capsys) -> None:
    assert (
        main(
            [
                "train",
                "--parallel",
                "--max-staleness",
                "1",
                "--topology",
                "sharded",
                "--no-progress",
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error:") and "sharded" in err and "Traceback" not in err


def test_accumulate_steps_and_compile_flags_parse_and_reach_the_master() -> None:
    from torchspark.cli import master_from_args
    from torchspark.encoding import AdaptiveThreshold

    parse = build_parser().parse_args
    assert (parse(["train"]).accumulate_steps, parse(["train"]).compile) == (1, False)
    assert parse(["train", "--compile"]).compile is True  # the default backend
    assert parse(["train", "--compile", "aot_eager"]).compile == "aot_eager"
    assert parse(["train", "--compile", "max-autotune"]).compile == "max-autotune"
    for mode in ("averaging", "sharing"):
        args = parse(["train", "--training-mode", mode, "--accumulate-steps", "3"])
        assert master_from_args(args, AdaptiveThreshold()).accumulate_steps == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--accumulate-steps", "0"], "--accumulate-steps: must be >= 1, got 0"),
        (["train", "--compile", "turbo"], "--compile: compile must be one of ['default', 'reduce-overhead'"),
    ],
)
def test_bad_accumulate_steps_or_compile_exit_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_compile_and_accumulation_train_and_reach_the_saved_network(tmp_path) -> None:
    from torchspark import Network

    out = tmp_path / "cc"
    assert (
        main(
            [
                "train",
                "--parallel",
                "--training-mode",
                "averaging",
                "--model",
                "mlp",
                "--epochs",
                "1",
                "--no-progress",
                "--compile",
                "aot_eager",
                "--accumulate-steps",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    saved = Network.load(str(out / "model"))
    assert saved.compile == "aot_eager"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.3
