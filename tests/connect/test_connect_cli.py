"""``torchspark train --remote sc://HOST:PORT`` trains through a Spark Connect session (in a child process, as a
user runs it: the command stops its session at the end, which must not stop this tier's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.timeout(900)  # a full `torchspark train --remote` in a child process (its own limit is 600 s)
def test_train_remote_runs_the_main_job_under_connect(connect_server, tmp_path) -> None:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "torchspark.cli",
        "train",
        "--remote",
        connect_server.url,
        "--epochs",
        "2",
        "--num-workers",
        "2",
        "--batch-size-per-worker",
        "32",
        "--training-mode",
        "averaging",
        "--no-progress",
        "--progress-directory",
        str(tmp_path / "progress"),
        "--output",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["spark_master"] == connect_server.url and metrics["runner"] == "SparkNetwork"
    assert metrics["accuracy"] > 0.2  # trained (chance is 0.1)
    assert (out / "stats.html").exists() and (out / "model").is_dir()
    # --progress-directory: the workers' progress went through files there (the local server would have used TCP);
    # the fit's own subdirectory is removed after it succeeded
    assert (tmp_path / "progress").is_dir() and os.listdir(tmp_path / "progress") == []
