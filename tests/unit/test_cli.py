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


# ------------------------------------------------------------------ exit codes, logging, --config, predict's output
def _cli_page() -> object:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "cli_page.py"
    spec = importlib.util.spec_from_file_location("cli_page", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_guide_is_generated_from_the_parser_and_the_exit_codes() -> None:
    """docs/guides/cli.md's synopsis and exit-code table are what the parser and EXIT_CODES give today; a new
    option, command or error class fails this test until `python docs/hooks/cli_page.py` is run."""
    from pathlib import Path

    page = _cli_page()
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "cli.md").read_text()
    assert page.refresh(guide) == guide, "docs/guides/cli.md drifted: run python docs/hooks/cli_page.py"  # type: ignore[attr-defined]
    for name, sub in build_parser()._subparsers._group_actions[0].choices.items():  # type: ignore[union-attr]
        for action in sub._actions:
            for option in action.option_strings:
                assert option in guide, f"torchspark {name} {option} is missing from the guide's synopsis"
    from torchspark import errors
    from torchspark.cli_exit import exit_code

    for cls in [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.TorchSparkError)]:
        assert f"| `{cls.__name__}` | {exit_code(cls('x'))} (" in guide, cls


def test_a_runtime_failure_exits_1_not_argparses_2(tmp_path, capsys) -> None:
    """A training that diverges (a worker's TrainingError) is a runtime failure: 1, which a scheduler can tell
    from a typo (2)."""
    argv = ["train", "--parallel", "--training-mode", "averaging", "--model", "mlp", "--epochs", "1"]
    argv += ["--updater", "sgd", "--lr", "1e30", "--no-progress", "--output", str(tmp_path / "o")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: ") and "TrainingError: loss turned nan" in err
    assert main(["train", "--parallel", "--epochs", "100000000", "--output", str(tmp_path / "o")]) == 2  # usage


@pytest.mark.timeout(900)
def test_ctrl_c_exits_130_with_one_line_and_log_level_debug_logs(tmp_path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) in the middle of a --parallel fit: exit 130,
    one line, no traceback from the command, its fork server or its workers. --log-level debug logged the fit's
    start (at the default level nothing is logged)."""
    import os
    import signal

    cmd = [sys.executable, "-m", "torchspark.cli", "train", "--parallel", "--training-mode", "averaging"]
    cmd += ["--model", "mlp", "--epochs", "100000", "--log-level", "debug", "--output", str(tmp_path / "o")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    seen = ""
    try:
        while "score=" not in seen:  # the progress bar's score: the workers are training
            char = proc.stderr.read(1)
            assert char, seen[-3000:]
            seen += char
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=300) == 130, rest[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "DEBUG torchspark." in seen
    assert rest.strip().splitlines()[-1] == "torchspark: interrupted" and "Traceback" not in rest, rest[-3000:]
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(900)
def test_quiet_shows_no_progress_bar_and_no_log_but_the_results(tmp_path) -> None:
    cmd = [sys.executable, "-m", "torchspark.cli", "train", "--parallel", "--training-mode", "averaging", "-q"]
    cmd += ["--model", "mlp", "--epochs", "1", "--output", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # without -q: the progress bar ("fit x1 ... ex/s")
    assert "accuracy" in proc.stdout and (tmp_path / "o" / "model").is_dir()


def test_verbose_quiet_and_log_level_are_one_choice(tmp_path, capsys) -> None:
    from torchspark.cli import _parse, log_level

    with pytest.raises(SystemExit) as info:
        main(["train", "-q", "--log-level", "debug"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    both = tmp_path / "both.yaml"
    both.write_text("quiet: true\nlog_level: debug\n")
    assert main(["evaluate", "--model", "m", "--config", str(both)]) == 2
    assert "--quiet and --log-level debug set the same thing" in capsys.readouterr().err
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("quiet: true\n")
    parser = build_parser()
    args = _parse(parser, ["evaluate", "--model", "m", "--config", str(quiet), "-v"])  # the command line wins
    assert (args.quiet, args.verbose, log_level(args)) == (False, True, 20)
    assert log_level(_parse(build_parser(), ["evaluate", "--model", "m", "--config", str(quiet)])) == 40


def test_config_on_every_subcommand(tmp_path, capsys) -> None:
    """evaluate, predict and advise read --config too; a required option (predict --model, --output) may come
    from the file, and the command line wins over it."""
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    predict = tmp_path / "predict.yaml"
    predict.write_text(f"model: {tmp_path / 'model'}\noutput: {users}\nclass: true\n")
    assert main(["predict", "--config", str(predict)]) == 2
    assert "unknown predict option 'class'" in capsys.readouterr().err  # its name is as_class
    predict.write_text(f"model: {tmp_path / 'model'}\noutput: {users}\nas_class: true\n")
    assert main(["predict", "--config", str(predict)]) == 2
    assert f"--output {str(users)!r} already exists and holds 1 entry" in capsys.readouterr().err
    assert (users / "notes.txt").read_text() == "keep me"
    assert main(["evaluate", "--config", str(predict)]) == 2
    assert "unknown evaluate option 'as_class'" in capsys.readouterr().err
    evaluate = tmp_path / "evaluate.json"
    evaluate.write_text(json.dumps({"model": str(tmp_path / "missing"), "batch-size": 7}))
    assert main(["evaluate", "--config", str(evaluate)]) == 2
    assert f"--model {str(tmp_path / 'missing')!r} is not a directory" in capsys.readouterr().err
    advise = tmp_path / "advise.yaml"
    advise.write_text("model: mlp\ninput_shape: 64\nbatch_size: 8\niterations: 2\nwarmup: 0\njson: true\n")
    assert main(["advise", "--config", str(advise), "--num-workers", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["measurement"]["batch_size"], report["num_workers"]) == (8, 3), report


@pytest.mark.parametrize(
    ("case", "overwrite", "fragment"),
    [
        ("user files", False, "already exists and holds 2 entries (e.g. 'a.txt'); pass --overwrite"),
        ("model", True, "is --model"),
        ("inside model", True, "lies inside --model"),
        ("parent of data", True, "holds --data"),
        ("data", False, "is --data"),
        ("working directory", True, "is the working directory"),
    ],
)
def test_predict_refuses_an_output_it_would_delete_before_spark_starts(
    case: str, overwrite: bool, fragment: str, tmp_path, capsys, monkeypatch
) -> None:
    """What `predict --output` deleted (a directory of the user's files, the parent of --data, the --model
    directory): refused in one line with exit 2, before anything loads or starts, whatever is in them."""
    model, data_dir, mine, cwd = tmp_path / "model", tmp_path / "data", tmp_path / "mine", tmp_path / "cwd"
    for d in (model, data_dir, mine, cwd):
        d.mkdir()
    (model / "config.json").write_text("{}")
    (data_dir / "in.parquet").write_text("x")
    (mine / "a.txt").write_text("a")
    (mine / "b.txt").write_text("b")
    monkeypatch.chdir(cwd)
    output = {
        "user files": mine,
        "model": model,
        "inside model": model / "preds",
        "parent of data": data_dir,
        "data": data_dir / "in.parquet",
        "working directory": cwd,
    }[case]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    argv = ["predict", "--model", str(model), "--data", str(data_dir / "in.parquet"), "--output", str(output)]
    assert main(argv + (["--overwrite"] if overwrite else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: --output") and err.count("\n") == 1 and fragment in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_train_takes_your_own_module_by_import_path_under_trust_code(tmp_path, capsys) -> None:
    """``--model pkg.mod:factory`` imports your class only with --trust-code (refused before anything is read or
    written otherwise), calls it with --model-kwargs, and the saved model rebuilds from its recorded arguments."""
    from own_models import DigitsNet
    from torchspark import Network

    out = tmp_path / "own"
    base = ["train", "--parallel", "--training-mode", "averaging", "--epochs", "1", "--no-progress"]
    own = ["--model", "own_models:DigitsNet", "--model-kwargs", '{"hidden": 24}', "--output", str(out)]
    assert main([*base, *own]) == 2
    assert "pass --trust-code" in capsys.readouterr().err and not out.exists()
    assert main([*base, *own, "--trust-code"]) == 0
    net = Network.load(str(out / "model"), factories=[DigitsNet])
    assert type(net.module) is DigitsNet and net.module.fc1.out_features == 24
    assert json.loads((out / "metrics.json").read_text())["accuracy"] > 0.15  # trained: chance is 0.1
    assert (
        main(
            [
                *base,
                "--model",
                "own_models:DigitsNet",
                "--model-kwargs",
                '{"width": 3}',
                "--trust-code",
                "--output",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    assert "refused --model-kwargs {'width': 3}" in capsys.readouterr().err
    assert main([*base, "--model-kwargs", '{"hidden": 3}', "--output", str(tmp_path / "zoo")]) == 2
    assert "drop --model-kwargs" in capsys.readouterr().err
