"""Default exports leak nothing: a private 0700 directory with a fresh name (no symlink followed), removed on
close, with-block exit, garbage collection and interpreter exit; a killed driver's directory is removed by the next
run. An explicit ``export_directory`` is kept until ``close()``/``delete_temp_files()``, as before."""

from __future__ import annotations

import gc
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import pytest

from helpers import mlp_net
from torchspark import DataSet, datasets, optim
from torchspark.errors import DataError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.spark.private_dirs import OWNER_FILE, PREFIX, make_private_dir, remove_stale

SCRIPT = Path(__file__).parent / "scripts" / "export_leftovers.py"


def _master(**kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, averaging_frequency=2, num_workers=2, rdd_training_approach="export", **kw
    )


_net = partial(mlp_net, 6, 8, 3, updater=optim.SGD(lr=0.05))


def _rdd(sc, labels_offset: int = 0):
    data = datasets.synthetic_classification(96, 6, 3, seed=1)
    if labels_offset:
        data = DataSet(data.features, data.labels + labels_offset)
    return sc.parallelize(data.split(16), 3)


@pytest.fixture()
def temp_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sc) -> Path:
    """Default exports go under tmp_path (the session sets no spark.local.dir; the temp directory is the base)."""
    if sc.getConf().get("spark.local.dir", None):
        pytest.skip("the session sets spark.local.dir; these tests steer the base through the temp directory")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _private(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if p.name.startswith(PREFIX))


def test_default_export_is_private_and_removed_on_close(spark, sc, temp_base: Path) -> None:
    # a symlink planted at the old fixed path and one at a likely name: neither is followed
    victim = temp_base / "victim"
    victim.mkdir()
    (temp_base / "torchspark-export").symlink_to(victim)
    snet = SparkNetwork(spark, _net(), _master(), progress=False)
    snet.fit(_rdd(sc), epochs=1)
    [private] = _private(temp_base)
    mode = private.lstat().st_mode
    assert stat.S_ISDIR(mode) and not stat.S_ISLNK(mode) and stat.S_IMODE(mode) == 0o700
    assert (private / OWNER_FILE).exists()
    assert len(list(private.rglob("*.safetensors"))) >= 96 // 8 // 2
    assert list(victim.iterdir()) == []
    snet.close()
    assert _private(temp_base) == [] and list(victim.iterdir()) == []


def test_with_block_removes_the_export_even_when_the_fit_fails(spark, sc, temp_base: Path) -> None:
    with pytest.raises(DataError, match="out of range"):
        with SparkNetwork(spark, _net(), _master(), progress=False) as snet:
            snet.fit(_rdd(sc, labels_offset=5), epochs=1)  # labels 5..7 for 3 classes: found after the export
    assert snet.preparation.private_dirs == [] and _private(temp_base) == []


def test_garbage_collection_removes_the_export(spark, sc, temp_base: Path) -> None:
    snet = SparkNetwork(spark, _net(), _master(), progress=False)
    snet.fit(_rdd(sc), epochs=1)
    assert len(_private(temp_base)) == 1
    del snet
    gc.collect()
    assert _private(temp_base) == []


def test_explicit_export_directory_is_kept_until_close(spark, sc, tmp_path: Path) -> None:
    snet = SparkNetwork(spark, _net(), _master(export_directory=str(tmp_path / "exports")), progress=False)
    snet.fit(_rdd(sc), epochs=1)
    del snet
    gc.collect()
    assert list((tmp_path / "exports").rglob("*.safetensors"))  # not removed by garbage collection
    assert _private(tmp_path) == []


@pytest.fixture(scope="module")
def killed_driver(tmp_path_factory) -> tuple[Path, dict]:
    """One driver process that fits into a default export (under its temp directory, ``base``) and into an explicit
    ``base/exports``, then is killed with SIGKILL; (``base``, its report). Both killed-driver tests read it."""
    base = tmp_path_factory.mktemp("killed-driver")
    return base, _killed_after_its_fit(_run("hang", base, base / "exports"))


def test_a_killed_drivers_export_in_an_explicit_export_directory_is_removed_by_the_next_export(
    spark, sc, killed_driver: tuple[Path, dict]
) -> None:
    base, report = killed_driver
    exports = base / "exports"
    leftover = Path(report["explicit"])
    assert leftover.parent == exports and any(leftover.rglob("*.safetensors"))  # SIGKILL: nothing cleaned up
    unmarked = exports / "0123456789ab-rdd1"  # an export without an owner record (an older version's): kept
    unmarked.mkdir()
    snet = SparkNetwork(spark, _net(), _master(export_directory=str(exports)), progress=False)
    snet.fit(_rdd(sc), epochs=1)
    assert not leftover.exists() and unmarked.is_dir()
    [mine] = [p for p in exports.iterdir() if p != unmarked]
    assert json.loads((mine / OWNER_FILE).read_text())["pid"] == os.getpid()
    snet.close()
    assert list(exports.iterdir()) == [unmarked]


def _run(how: str, base: Path, export_directory: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(base)}
    extra = [str(export_directory)] if export_directory is not None else []
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), how, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _killed_after_its_fit(proc: subprocess.Popen) -> dict:
    """The report a hanging driver prints after its fit; then the driver is killed with SIGKILL (no clean-up)."""
    try:
        line = proc.stdout.readline()  # blocks until the fit is done (the script's timeouts bound it)
        assert line, proc.stderr.read()[-3000:]
        return json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def test_interpreter_exit_removes_the_export(tmp_path: Path) -> None:
    proc = _run("exit", tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["files"] >= 2 and report["directory"].startswith(str(tmp_path))
    assert not os.path.exists(report["directory"]) and _private(tmp_path) == []


def test_a_killed_drivers_export_is_removed_by_the_next_run(
    spark, sc, killed_driver: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    temp_base, report = killed_driver
    if sc.getConf().get("spark.local.dir", None):
        pytest.skip("the session sets spark.local.dir; this test steers the base through the temp directory")
    monkeypatch.setattr(tempfile, "tempdir", str(temp_base))
    leftover = Path(report["directory"])
    assert leftover.parent == temp_base and any(leftover.rglob("*.safetensors"))  # SIGKILL: nothing cleaned up
    alive = make_private_dir(str(temp_base))  # a live owner's directory (this process) is never taken
    snet = SparkNetwork(spark, _net(), _master(), progress=False)
    snet.fit(_rdd(sc), epochs=1)  # the next run
    assert not leftover.exists()
    assert Path(alive).is_dir() and len(_private(temp_base)) == 2
    snet.close()
    assert remove_stale(str(temp_base)) == [] and _private(temp_base) == [Path(alive)]
