"""CLI parsing and validation (no Spark)."""

from __future__ import annotations

import pytest

from torchspark.cli import build_parser, main


def test_defaults_train_with_gradient_sharing_on_spark() -> None:
    args = build_parser().parse_args(["train"])
    assert args.mode == "sharing" and not args.parallel
    assert args.threshold == 1e-2 and args.workers == 2 and args.epochs == 8


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--workers", "0"], "--workers: must be >= 1, got 0"),
    (["train", "--epochs", "two"], "--epochs: 'two' is not an integer"),
    (["train", "--lr", "-1"], "--lr: must be > 0"),
    (["train", "--mode", "sync"], "invalid choice: 'sync'"),
    (["train", "--memory-format", "nhwc"], "invalid choice: 'nhwc'"),
    (["evaluate", "--model", "m", "--feature-shape", "1,a"], "is not a shape such as 1,28,28"),
    (["predict", "--model", "m"], "--output"),
])
def test_bad_arguments_exit_2_naming_the_value(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_model_directory_is_a_one_line_error(tmp_path, capsys) -> None:
    assert main(["evaluate", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: --model") and "Traceback" not in err


def test_parallel_training_needs_no_spark(tmp_path) -> None:
    out = tmp_path / "par"
    assert main(["train", "--parallel", "--mode", "averaging", "--epochs", "1", "--no-progress",
                 "--output", str(out)]) == 0
    for name in ("metrics.json", "stats.json", "stats.html", "model"):
        assert (out / name).exists(), name


def test_memory_format_reaches_the_saved_network(tmp_path) -> None:
    from torchspark import Network

    out = tmp_path / "cl"
    assert main(["train", "--parallel", "--mode", "averaging", "--epochs", "1", "--no-progress",
                 "--memory-format", "channels_last", "--output", str(out)]) == 0
    assert Network.load(str(out / "model")).memory_format == "channels_last"
