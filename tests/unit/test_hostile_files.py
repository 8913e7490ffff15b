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
    with pytest.raises(ConfigError, match="/dev/zero.*larger than 1 MiB"):  # never slurped
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
