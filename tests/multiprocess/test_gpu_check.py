"""benchmarks/gpu_check.py runs on a machine without CUDA (CI) as a smoke test: with --quick every check runs on the
CPU, none fails, and the JSON holds every check's row (``n/a`` only where this build lacks the API a check needs)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _gpu_checks as G  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke test; on a GPU run the check itself")
def test_the_gpu_check_runs_every_check_on_the_cpu_without_failures(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--quick", "--out", str(out), "--budget-s", "600"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    names = [r["check"] for r in report["checks"]]
    expected = [n for check in G.CHECKS.values() for n in check.rows]
    assert names == expected == report["expected_checks"]
    assert len(expected) == len(set(expected)) >= 12
    bad = {r["check"]: r["result"] for r in report["checks"] if r["status"] not in ("pass", "n/a")}
    assert not bad and report["failed"] == []
    assert report["ran_on_gpu"] is False and report["device"] == "cpu" and report["quick"] is True
    assert "no CUDA on this machine" in proc.stdout and "| check | device | result | status |" in proc.stdout
    by_name = {r["check"]: r for r in report["checks"]}
    assert by_name["codec_bit_equal"]["status"] == "pass"  # never n/a: the codec is in every build
    assert by_name["pinned_memory"]["figures"]["pinned_handouts"] == {"off": None, "on": None}  # nothing pinned
    for name in ("codec_throughput_0.1pct", "codec_throughput_1pct"):
        figures = by_name[name]["figures"]
        assert figures["encode_gbps"] > 0 and figures["decode_gbps"] > 0 and figures["copy_gbps"] > 0
