"""Hostile or damaged files are refused with a clear error before anything is built (issue 31)."""

from __future__ import annotations

import json

import pytest

from torchspark.config_files import load_master
from torchspark.errors import ConfigError, SerializationError
from torchspark.spark import SharedTrainingMaster
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.stats.html import render_html
from torchspark.training.config.mesh import MAX_TIMEOUT_S, MeshConfig


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["x"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "type: sharing\n" + "\n".join(lines) + "\n"


def test_a_yaml_anchor_bomb_is_refused_before_it_expands(tmp_path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text(_bomb(4))  # 10**4 leaves here; 9 levels would be 10**9 (the probe's MemoryError)
    with pytest.raises(ConfigError, match=r"master.yaml.*aliases \(\*name\) are not accepted.*line 3"):
        load_master(str(path))


@pytest.mark.parametrize(
    "name, text, line",
    [
        ("m.yaml", "type: sharing\nnum_workers: 2\nnum_workers: 4\n", "line 3"),
        ("m.json", '{"type": "sharing", "num_workers": 2, "num_workers": 4}', ""),
    ],
)
def test_a_duplicate_key_is_an_error_naming_the_key(tmp_path, name, text, line) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{name}.*'num_workers' appears twice.*{line}"):
        load_master(str(path))


def test_binary_and_endless_config_files_are_refused_after_a_bounded_read(tmp_path) -> None:
    binary = tmp_path / "model.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 10)
    with pytest.raises(ConfigError, match="model.yaml.*not UTF-8 text"):
        load_master(str(binary))
    big = tmp_path / "huge.json"
    big.write_bytes(b"0" * (2 << 20))
    with pytest.raises(ConfigError, match="huge.json.*larger than 1 MiB"):
        load_master(str(big))
    with pytest.raises(ConfigError, match="/dev/zero' is a character device, not a regular file"):  # never read
        load_master("/dev/zero")
    nul = tmp_path / "nul.json"
    nul.write_bytes(b'{"type": "sharing"}\x00\x00')
    with pytest.raises(ConfigError, match="nul.json.*NUL bytes"):
        load_master(str(nul))


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300, MAX_TIMEOUT_S * 2])
def test_an_unbounded_rendezvous_timeout_is_a_config_error(value) -> None:
    with pytest.raises(ConfigError, match=r"rendezvous_timeout_s must be a finite number of seconds.*pass a finite"):
        MeshConfig(rendezvous_timeout_s=value)
    with pytest.raises(ConfigError, match="rendezvous_timeout_s"):
        SharedTrainingMaster(rendezvous_timeout_s=value)
    assert MeshConfig(rendezvous_timeout_s=MAX_TIMEOUT_S).rendezvous_timeout_s == MAX_TIMEOUT_S


def _stats() -> TrainingStats:
    c = StatsCollector("worker-0")
    c.record_phase("fit", 0.1, start=1000.0, examples=16, iteration=0)
    return TrainingStats.from_payloads([c.drain()])


def test_every_summary_field_is_escaped_in_the_html_report() -> None:
    stats = _stats()
    for key in ("workers", "events", "wall_seconds", "my_note"):
        stats.set_summary(key, "<script>alert(1)</script>")
    stats.set_summary("worker_ids", ["<script>w</script>"])
    stats.set_summary("failures", [{"attempt": 0, "rank": "<script>", "reason": "<img src=x onerror=alert(1)>"}])
    page = render_html(stats)
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize(
    "field, value",
    [
        ("wall_seconds", "soon"),
        ("workers", "<script>alert(1)</script>"),
        ("worker_ids", "w0"),
        ("failures", [1, 2]),
        ("failures", [{"started": "x"}]),
        ("events", True),
    ],
)
def test_a_damaged_stats_json_is_a_serialization_error_naming_the_field(field, value) -> None:
    doc = json.loads(_stats().to_json())
    doc["summary_fields"][field] = value
    with pytest.raises(SerializationError, match=f"damaged.*{field}"):
        TrainingStats.from_json(json.dumps(doc))


def test_a_stats_json_with_wrong_shapes_is_a_serialization_error() -> None:
    doc = json.loads(_stats().to_json())
    doc["payloads"] = ["not an object"]
    with pytest.raises(SerializationError, match="damaged"):
        TrainingStats.from_json(json.dumps(doc))
    doc = json.loads(_stats().to_json())
    doc["summary_fields"] = [1, 2]
    with pytest.raises(SerializationError, match=r"summary_fields = \[1, 2\], expected an object"):
        TrainingStats.from_json(json.dumps(doc))


DEEP = 100_000  # far past Python's recursion limit: a RecursionError traceback before the limits


def _deep_json() -> str:
    return '{"type": "sharing", "extra": ' + "[" * DEEP + "]" * DEEP + "}"


def _deep_yaml() -> str:
    return "type: sharing\nextra: " + "[" * DEEP + "]" * DEEP + "\n"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("deep.json", _deep_json(), "nests lists or mappings deeper than 64 levels"),
        ("deep.yaml", _deep_yaml(), "nests lists or mappings deeper than 64 levels"),
        ("big.json", '{"epochs": ' + "9" * 5000 + "}", "an integer of 5000 digits, more than the limit of 100"),
        ("big.yaml", "epochs: " + "9" * 5000 + "\n", "an integer of 5000 digits, more than the limit of 100"),
    ],
    ids=["deep-json", "deep-yaml", "big-int-json", "big-int-yaml"],
)
def test_deep_nesting_and_huge_integers_in_a_config_are_one_line_errors(tmp_path, capsys, name, text, message) -> None:
    from torchspark.cli import main

    path = tmp_path / name
    path.write_text(text)
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert message in err and name in err and "Traceback" not in err and len(err.splitlines()) <= 2, err
    with pytest.raises(ConfigError, match=f"{name}.*{message}"):  # a training master file: the same limits
        load_master(str(path))


def test_the_limits_hold_in_every_json_torchspark_parses(tmp_path) -> None:
    from torchspark import Network
    from torchspark.models import mlp
    from torchspark.nn.network_spec import NetworkSpec
    from torchspark.training.config.masters import master_from_json

    with pytest.raises(ConfigError, match="network spec nests lists or mappings deeper than 64"):
        NetworkSpec.from_json('{"model": "mlp", "kwargs": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(ConfigError, match="training master JSON is invalid: the text holds an integer of 5000 digits"):
        master_from_json('{"type": "sharing", "rng_seed": ' + "1" * 5000 + "}")
    Network(mlp(n_in=2, hidden=2, n_out=2), seed=0).save(str(tmp_path / "m"))
    config = (tmp_path / "m" / "config.json").read_text()
    for bad, message in (("[" * DEEP + "]" * DEEP, "deeper than 64 levels"), ("7" * 5000, "5000 digits")):
        (tmp_path / "m" / "config.json").write_text(config.replace('"seed": 0', f'"seed": {bad}'))
        with pytest.raises(SerializationError, match=f"config.json.*{message}"):
            Network.load(str(tmp_path / "m"))


def test_nesting_within_the_limit_is_read() -> None:
    from torchspark._io import load_mapping

    ok = "[" * 60 + "]" * 60
    assert load_mapping(f'{{"a": {ok}}}', "json")["a"] == load_mapping(f"a: {ok}\n", "yaml")["a"]
    assert load_mapping('{"seed": ' + "9" * 100 + "}", "json")["seed"] == int("9" * 100)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_fifo_directory_or_device_as_config_is_a_one_line_error_not_a_hang(tmp_path, capsys, kind) -> None:
    import os
    import threading

    from torchspark.cli import main

    path = {"fifo": tmp_path / "run.yaml", "directory": tmp_path, "device": "/dev/null"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(main(["train", "--config", str(path)])), daemon=True)
    runner.start()
    runner.join(timeout=30)
    if runner.is_alive() and kind == "fifo":  # it blocked: unblock the read (a writer that closes at once)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        runner.join(timeout=10)
    assert result == [2], "the --config read blocked or did not fail"
    err = capsys.readouterr().err
    what = {"fifo": "a FIFO (named pipe)", "directory": "a directory", "device": "a character device"}[kind]
    assert f"{str(path)!r} is {what}, not a regular file" in err and "Traceback" not in err, err


def test_a_fifo_as_a_models_config_json_is_refused_not_waited_on(tmp_path) -> None:
    import os
    import threading

    from torchspark import Network
    from torchspark.models import mlp

    path = tmp_path / "m"
    Network(mlp(n_in=2, hidden=2, n_out=2), seed=0).save(str(path))
    os.remove(path / "config.json")
    os.mkfifo(path / "config.json")
    errors: list[Exception] = []

    def load() -> None:
        try:
            Network.load(str(path))
        except Exception as e:  # the test inspects it
            errors.append(e)

    runner = threading.Thread(target=load, daemon=True)
    runner.start()
    runner.join(timeout=30)
    if runner.is_alive():  # it blocked: unblock the read (a writer that closes at once)
        os.close(os.open(path / "config.json", os.O_WRONLY | os.O_NONBLOCK))
        runner.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], SerializationError), errors
    assert "config.json' is a FIFO (named pipe), not a regular file" in str(errors[0])
