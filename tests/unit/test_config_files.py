"""Masters and `torchspark train` settings as YAML or JSON files."""

from __future__ import annotations

import json

import pytest

from torchspark.cli import _sharing_options, build_parser, check_mode_options, main
from torchspark.config_files import (
    apply_train_config,
    load_master,
    load_train_settings,
    master_from_yaml,
    save_master,
    train_settings,
)
from torchspark.encoding import AdaptiveThreshold, FixedThreshold
from torchspark.errors import ConfigError
from torchspark.training import ParameterAveragingTrainingMaster, SharedTrainingMaster

pytest.importorskip("yaml", reason="the [yaml] extra is part of the test extra")

MASTERS = [
    ParameterAveragingTrainingMaster(
        averaging_frequency=7, batch_size_per_worker=32, num_workers=3, averaging_via="spark", rng_seed=5
    ),
    SharedTrainingMaster(
        threshold_algorithm=AdaptiveThreshold(initial=2e-3),
        batch_size_per_worker=8,
        overlap=False,
        storage_level="MEMORY_AND_DISK",
    ),
    SharedTrainingMaster(threshold_algorithm=FixedThreshold(1e-4)),
]


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: type(m).__name__)
def test_masters_round_trip_through_yaml_and_files(master, tmp_path) -> None:
    text = master.to_yaml()
    assert "type:" in text and "{" not in text  # block-style YAML, not JSON
    assert type(master).from_yaml(text) == master
    assert master_from_yaml(text) == master
    for name in ("m.yaml", "m.yml", "m.json"):
        save_master(master, str(tmp_path / name))
        assert load_master(str(tmp_path / name)) == master
    assert json.loads((tmp_path / "m.json").read_text()) == master.to_dict()  # .json files stay JSON


def test_hand_written_yaml_reads_exponent_floats_and_names_bad_options() -> None:
    text = """
type: sharing
batch_size_per_worker: 64
threshold_algorithm:
  type: fixed
  threshold: 1e-4   # YAML 1.1 would read this as a string
"""
    master = SharedTrainingMaster.from_yaml(text)
    assert master.batch_size_per_worker == 64 and master.threshold_algorithm == FixedThreshold(1e-4)
    with pytest.raises(ConfigError, match="batch_sise"):
        master_from_yaml("type: sharing\nbatch_sise: 3\n")
    with pytest.raises(ConfigError, match="not a SharedTrainingMaster"):
        SharedTrainingMaster.from_yaml(ParameterAveragingTrainingMaster().to_yaml())
    with pytest.raises(ConfigError, match="mapping"):
        master_from_yaml("- 1\n- 2\n")


@pytest.mark.parametrize("old", ["shared_gradients", "parameter_averaging"])
def test_old_master_types_are_refused_listing_the_types(old: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown training master type '{old}'; known: \['averaging', 'sharing'\]"):
        master_from_yaml(f"type: {old}\nbatch_size_per_worker: 8\n")


def test_yaml_that_would_build_python_objects_is_refused(tmp_path) -> None:
    marker = tmp_path / "ran"
    text = f"type: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ConfigError, match="not valid YAML"):
        master_from_yaml(text)
    path = tmp_path / "run.yaml"
    path.write_text(f"epochs: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_train_settings(build_parser(), str(path))
    assert not marker.exists()


def _printed(argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_train_config_sets_options_and_the_command_line_wins(tmp_path, capsys) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "epochs: 3\ntraining_mode: averaging\naveraging-frequency: 9\nlr: 5e-3\nparallel: true\n"
        "threshold-algorithm: 1e-4\n"
    )
    settings = json.loads(_printed(["train", "--config", str(path), "--epochs", "5", "--print-config", "json"], capsys))
    assert (
        settings["training_mode"] == "averaging"
        and settings["averaging_frequency"] == 9
        and settings["parallel"] is True
    )
    assert settings["lr"] == 5e-3 and settings["threshold_algorithm"] == 1e-4
    assert settings["epochs"] == 5  # typed on the command line: over the file's 3
    assert settings["model"] == "lenet"  # untouched options keep their defaults
    # the printed settings are a config file: reading them back gives the same settings
    (tmp_path / "printed.yaml").write_text(_printed(["train", "--config", str(path), "--print-config"], capsys))
    again = json.loads(
        _printed(["train", "--config", str(tmp_path / "printed.yaml"), "--print-config", "json"], capsys)
    )
    assert again == {**settings, "epochs": 3}
    # JSON config files work the same
    (tmp_path / "run.json").write_text(json.dumps({"epochs": 2, "updater": "sgd"}))
    parser = build_parser()
    args = apply_train_config(
        parser,
        ["train", "--config", str(tmp_path / "run.json")],
        parser.parse_args(["train", "--config", str(tmp_path / "run.json")]),
    )
    assert (args.epochs, args.updater) == (2, "sgd")
    assert train_settings(parser, args)["updater"] == "sgd"


@pytest.mark.parametrize(
    "content, message",
    [
        ("epoks: 3\n", "unknown train option 'epoks'"),
        ("epochs: 0\n", "epochs: must be >= 1"),
        ("training_mode: gossip\n", "training_mode must be one of"),
        ("mode: averaging\n", "unknown train option 'mode'"),  # the old names: training_mode, num_workers,
        ("workers: 2\n", "unknown train option 'workers'"),  # threshold_algorithm
        ("threshold: 1e-4\n", "unknown train option 'threshold'"),
        ("parallel: 'yes'\n", "parallel must be true or false"),
        ("lr: [1, 2]\n", "lr must be a single value"),
        ("epochs: null\n", "epochs needs a value"),
        ("- epochs\n", "mapping"),
    ],
)
def test_bad_config_files_are_one_line_errors_naming_the_option(content, message, tmp_path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "Traceback" not in err


SHARING_SETTINGS = [
    {"topology": "all_gather", "max_staleness": 3, "shard_above_workers": 128},
    {"topology": "auto", "max_staleness": None, "shard_above_workers": 4},
    {"topology": "sharded", "max_staleness": None, "shard_above_workers": 128},
]


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("sharing", SHARING_SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_sharing_options_round_trip_through_config_files(sharing, fmt, tmp_path, capsys) -> None:
    """topology / max_staleness / shard_above_workers from a --config file reach the sharing master's settings, and
    --print-config writes them back so that reading the printed file gives the same master."""
    path = tmp_path / f"run.{fmt}"
    # dashes in the file, as on the command line
    path.write_text(json.dumps({k.replace("_", "-"): v for k, v in sharing.items()}))
    parser = build_parser()
    argv = ["train", "--config", str(path)]
    args = apply_train_config(parser, argv, parser.parse_args(argv))
    check_mode_options(args)
    options = _sharing_options(args)
    assert options == sharing
    master = SharedTrainingMaster(**options)
    assert {k: master.to_dict()[k] for k in sharing} == sharing
    printed = tmp_path / f"printed.{fmt}"
    printed.write_text(_printed([*argv, "--print-config", fmt], capsys))
    again = parser.parse_args(["train", "--config", str(printed)])
    again = apply_train_config(build_parser(), ["train", "--config", str(printed)], again)
    assert _sharing_options(again) == sharing


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("topology: sharded", "--topology"),
        ("shard_above_workers: 4", "--shard-above-workers"),
        ("max_staleness: 1", "--max-staleness"),
    ],
)
def test_sharing_options_in_a_config_file_are_refused_with_averaging(line, option, tmp_path, capsys) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"training_mode: averaging\nparallel: true\n{line}\noutput: {json.dumps(str(tmp_path / 'o'))}\n")
    assert main(["train", "--config", str(path)]) == 2
    assert f"{option} " in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("line", ["shard_above_workers: 0", "shard_above_workers: many"])
def test_bad_shard_above_workers_in_a_config_file_names_the_option(line, tmp_path, capsys) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(line + "\n")
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    assert "shard_above_workers:" in capsys.readouterr().err


def test_shard_above_workers_from_a_config_file_reaches_the_training(tmp_path) -> None:
    """``shard_above_workers: 1`` makes ``auto`` shard with 2 workers (it would all-gather if ignored)."""
    from torchspark import Network

    out = tmp_path / "out"
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "parallel": True,
                "num_workers": 2,
                "model": "mlp",
                "epochs": 1,
                "no_progress": True,
                "shard_above_workers": 1,
                "output": str(out),
            }
        )
    )
    assert main(["train", "--config", str(path)]) == 0
    assert Network.load(str(out / "model")).extra_config["sharing.topology"] == "sharded"


def test_a_missing_config_file_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the configuration file" in capsys.readouterr().err


def test_train_with_a_config_file_trains_with_its_settings(tmp_path) -> None:
    out = tmp_path / "out"
    path = tmp_path / "run.yaml"
    path.write_text(
        f"parallel: true\nnum_workers: 1\nmodel: mlp\ntraining_mode: averaging\nepochs: 1\nno_progress: true\n"
        f"output: {json.dumps(str(out))}\n"
    )
    assert main(["train", "--config", str(path)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["runner"], metrics["num_workers"], metrics["training_mode"], metrics["epochs"]) == (
        "ParallelWrapper",
        1,
        "averaging",
        1,
    )


@pytest.mark.parametrize(
    ("line", "expected"), [("compile: aot_eager", "aot_eager"), ("compile: true", True), ("compile: false", False)]
)
def test_compile_and_accumulate_steps_from_a_config_file(line, expected, tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"{line}\naccumulate_steps: 4\n")
    settings = load_train_settings(build_parser(), str(path))
    assert settings["compile"] == expected and settings["accumulate_steps"] == 4
