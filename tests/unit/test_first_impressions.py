"""First impressions: a quiet Spark start (the JVM's stderr silenced while it launches, unless verbose), no
duplicate keys in ``training_stats.summary()``, no undeclared-but-unused dependency, the advice for common data
mistakes on one process (float64 features train; the label shape is checked against the loss)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from torchspark import DataSet, Network, models
from torchspark._io import filesystem
from torchspark.errors import ConfigError
from torchspark.spark.session import _jvm_stderr_silenced
from torchspark.stats import StatsCollector
from torchspark.stats.training_stats import DRIVER_ID
from torchspark.training.driver.stats import build_training_stats

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("quiet", [True, False])
def test_a_process_launched_while_quiet_keeps_a_silent_stderr(quiet: bool, capfd) -> None:
    child = [sys.executable, "-c", "import sys; sys.stderr.write('WARNING: Using incubator modules\\n')"]
    with _jvm_stderr_silenced(quiet):
        subprocess.run(child, check=True)
    print("after", file=sys.stderr, flush=True)  # this process has its own stderr back
    err = capfd.readouterr().err
    assert ("incubator" in err) is not quiet
    assert "after" in err


def test_summary_names_each_sharing_headline_once() -> None:
    extra = {"sharing.bytes_sent": 120, "sharing.dense_bytes": 4000, "sharing.threshold": 0.01,
             "sharing.start_threshold": 0.02, "sharing.world_size": 2}
    summary = build_training_stats(StatsCollector(DRIVER_ID), [], 1, extra).summary()
    assert (summary["bytes_sent"], summary["dense_bytes"], summary["threshold"]) == (120, 4000, 0.01)
    assert summary["start_threshold"] == 0.02 and summary["sharing.world_size"] == 2  # not a headline: full name
    for short in ("bytes_sent", "dense_bytes", "threshold", "start_threshold"):
        assert f"sharing.{short}" not in summary, short


def test_plotly_is_neither_declared_nor_imported() -> None:
    declared = (ROOT / "pyproject.toml").read_text() + (ROOT / "constraints.txt").read_text()
    assert "plotly" not in declared
    sources = "".join(p.read_text() for p in (ROOT / "src" / "torchspark").rglob("*.py"))
    assert not re.search(r"^\s*(import|from)\s+plotly", sources, re.MULTILINE)


def test_float64_features_train_a_float32_network() -> None:
    """numpy's default dtype used to fail with 'Check the feature shape'; floating features take the network's."""
    x = np.random.default_rng(0).random((32, 6))  # float64
    y = np.random.default_rng(1).integers(0, 3, 32)
    net = Network(models.mlp(6, 8, 3), seed=0)
    net.fit(DataSet(x, y), batch_size=8)
    assert net.iteration == 4 and np.isfinite(net.score(DataSet(x, y)))
    assert net.output(x).dtype.__str__() == "torch.float32"


@pytest.mark.parametrize("url", ["hdfs://namenode:8020/data", "foo://bucket/data"])
def test_a_missing_filesystem_backend_is_named(url: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(url.split("://")[0])) as info:
        filesystem(url)
    assert "install it" in str(info.value).lower() or "use a local path" in str(info.value).lower()
