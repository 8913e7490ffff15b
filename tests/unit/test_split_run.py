"""The split run (``tests/split_run.py``): the Spark-free tiers of a mixed run go to a child pytest process and
their reports come back as this session's own."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import split_run

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

PROBE = """
import os
import pytest


def test_records_its_process():
    with open(os.environ["SPLIT_PROBE_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))


def test_fails():
    assert 1 == 2, "one is not two"


def test_skips():
    pytest.skip("not here")
"""


def _item(folder: str) -> SimpleNamespace:
    return SimpleNamespace(path=TESTS / folder / "test_x.py", nodeid=f"tests/{folder}/test_x.py::t")


class _Config:
    def __init__(self, **options: object) -> None:
        self.options = {"usepdb": False, "maxfail": 0, "dist": "no", **options}

    def getoption(self, name: str, default: object = None) -> object:
        return self.options.get(name, default)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (split_run.SPLIT_ENV, split_run.CHILD_ENV, "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(name, raising=False)


def test_only_a_mixed_run_splits_and_only_the_spark_free_tiers_leave(clean_env, monkeypatch) -> None:
    unit, multiprocess, spark, multihost = _item("unit"), _item("multiprocess"), _item("spark"), _item("multihost")
    assert split_run.plan_split(_Config(), [multihost, multiprocess, spark, unit]) == [multiprocess, unit]
    assert split_run.plan_split(_Config(), [multiprocess, unit]) == []  # nothing left to overlap
    assert split_run.plan_split(_Config(), [spark, multihost]) == []
    stays = SimpleNamespace(path=TESTS / "multiprocess" / "test_parallel_shutdown.py", nodeid="stays")
    assert split_run.plan_split(_Config(), [spark, stays, unit]) == [unit]
    shipping = SimpleNamespace(path=TESTS / "spark" / "test_shipping.py", nodeid="moves")
    assert split_run.plan_split(_Config(), [spark, shipping]) == [shipping]
    for options in ({"usepdb": True}, {"maxfail": 1}, {"dist": "loadgroup"}):
        assert split_run.plan_split(_Config(**options), [spark, unit]) == [], options
    monkeypatch.setenv(split_run.SPLIT_ENV, "0")
    assert split_run.plan_split(_Config(), [spark, unit]) == []
    monkeypatch.delenv(split_run.SPLIT_ENV)
    monkeypatch.setenv(split_run.CHILD_ENV, "ids:reports")  # the child itself never splits again
    assert split_run.plan_split(_Config(), [spark, unit]) == []


def test_the_childs_results_are_this_runs_results(tmp_path) -> None:
    """A run of a unit module and a Spark test splits: the unit tests run in another process, and their failure,
    skip and pass are reported by the parent (exit code, summary lines) as if they had run there. (That
    ``TORCHSPARK_SPLIT_RUN=0`` keeps one process is the previous test's; a second run here would cost 8 s.)"""
    probe = TESTS / "unit" / f"test_zz_split_probe_{secrets.token_hex(4)}.py"
    pid_file = tmp_path / "pid"
    env = {k: v for k, v in os.environ.items() if k not in (split_run.CHILD_ENV, "PYTEST_XDIST_WORKER")}
    env.update({"SPLIT_PROBE_PID_FILE": str(pid_file), split_run.SPLIT_ENV: "1", "COLUMNS": "250"})
    other = "tests/spark/test_master_options_spark.py::test_storage_level_names_are_pysparks"  # no session needed
    before = {d.name for d in Path(tempfile.gettempdir()).glob("torchspark-split-*")}
    probe.write_text(PROBE)
    try:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs", str(probe), other]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=300)
    finally:
        probe.unlink()
    name = f"tests/unit/{probe.name}"
    assert proc.returncode == 1, out[-3000:]
    assert f"FAILED {name}::test_fails - AssertionError: one is not two" in out, out[-3000:]
    assert f"SKIPPED [1] {name}:" in out and "not here" in out, out[-3000:]
    assert "1 failed, 2 passed, 1 skipped" in out, out[-3000:]
    assert not [d for d in Path(tempfile.gettempdir()).glob("torchspark-split-*") if d.name not in before], (
        "a child that reported every test leaves no files"
    )
    ran_in = int(pid_file.read_text())
    assert ran_in != proc.pid, (ran_in, proc.pid)
