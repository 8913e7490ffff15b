"""Private export directories and the stale-owner cleanup, with real processes and no Spark."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from torchspark.spark.private_dirs import (
    LEGACY_FOLDER,
    LEGACY_MAX_AGE_S,
    OWNER_FILE,
    PREFIX,
    make_private_dir,
    remove_dirs,
    remove_legacy_exports,
    remove_stale,
)

_MAKE_AND_DIE = """
import os, sys
from torchspark.spark.private_dirs import make_private_dir
path = make_private_dir(sys.argv[1])
open(os.path.join(path, "batch.safetensors"), "wb").write(b"data")
print(path, flush=True)
os._exit(0)  # no finalizers, no atexit: as a killed driver
"""


def _owner(path: str) -> dict:
    return json.loads((Path(path) / OWNER_FILE).read_text())


def test_private_dir_is_0700_fresh_and_records_its_owner(tmp_path: Path) -> None:
    a, b = make_private_dir(str(tmp_path)), make_private_dir(str(tmp_path))
    assert a != b and all(os.path.basename(p).startswith(PREFIX) for p in (a, b))
    assert stat.S_IMODE(os.lstat(a).st_mode) == 0o700
    assert _owner(a)["pid"] == os.getpid() and _owner(a)["host"] == socket.gethostname()
    remove_dirs(dirs := [a, b])
    assert dirs == [] and not os.path.exists(a) and not os.path.exists(b)


def _record(base: Path, **owner: object) -> str:
    path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
    (Path(path) / OWNER_FILE).write_text(json.dumps(owner))
    return path


def test_only_directories_of_dead_owners_on_this_host_are_removed(tmp_path: Path) -> None:
    live = make_private_dir(str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", _MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    assert os.path.isdir(dead) and os.path.isdir(live)  # the second process left the live owner's directory alone
    me = _owner(live)
    reused = _record(tmp_path, **{**me, "start": "1"})  # our pid, another start time: the pid was reused
    elsewhere = _record(tmp_path, **{**me, "pid": 2**22 + 7, "host": "other"})  # another host's (shared /tmp)
    unmarked = tmp_path / f"{PREFIX}unmarked"  # no owner record: not ours to judge
    unmarked.mkdir()
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / f"{PREFIX}link").symlink_to(target)  # a planted symlink is never followed or removed
    assert sorted(remove_stale(str(tmp_path))) == sorted([dead, reused])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [os.path.basename(live), os.path.basename(elsewhere), unmarked.name, "victim", f"{PREFIX}link"]
    )
    assert (target / "keep").exists()


_DAY = 24 * 3600.0


def _legacy_export(folder: Path, name: str, age_s: float) -> Path:
    """An export as versions before the private directories left it: ``<base>/torchspark-export/<hex>-rddN``,
    with batch files, everything last modified ``age_s`` ago."""
    export = folder / name
    (export / "part").mkdir(parents=True)
    for path in (export / "part00000-ab_000000.safetensors", export / "part" / "x.safetensors"):
        path.write_bytes(b"data")
    stamp = os.path.getmtime(export) - age_s
    for path in [*export.rglob("*"), export]:
        os.utime(path, (stamp, stamp), follow_symlinks=False)
    return export


def test_legacy_exports_untouched_for_a_week_are_removed_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / LEGACY_FOLDER
    old = _legacy_export(folder, "0123456789ab-rdd7", 8 * _DAY)
    recent = _legacy_export(folder, "abcdefabcdef-rdd3", 6 * _DAY)  # inside the documented age: kept
    touched = _legacy_export(folder, "00000000ffff-rdd1", 8 * _DAY)
    (touched / "part" / "x.safetensors").write_bytes(b"new")  # one file written now: still in use
    other_name = _legacy_export(folder, "my-own-folder", 30 * _DAY)  # not an export's name
    victim = _legacy_export(tmp_path / "elsewhere", "111111111111-rdd1", 30 * _DAY)
    (folder / "222222222222-rdd2").symlink_to(victim)  # a planted symlink: neither followed nor removed
    assert remove_legacy_exports(str(tmp_path)) == [str(old)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [recent.name, touched.name, other_name.name, "222222222222-rdd2"]
    )
    assert (victim / "part" / "x.safetensors").exists()
    # the age is a parameter: with 5 days the 6-day-old export goes too; the folder stays while anything is left
    assert remove_legacy_exports(str(tmp_path), max_age_s=5 * _DAY) == [str(recent)]
    assert folder.is_dir() and LEGACY_MAX_AGE_S == 7 * _DAY


def test_the_legacy_folder_goes_when_emptied_and_is_never_followed_through_a_symlink(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    target = tmp_path / "target"
    planted = _legacy_export(target, "0123456789ab-rdd7", 30 * _DAY)
    (base / LEGACY_FOLDER).symlink_to(target)
    assert remove_legacy_exports(str(base)) == [] and planted.is_dir()
    (base / LEGACY_FOLDER).unlink()
    old = _legacy_export(base / LEGACY_FOLDER, "0123456789ab-rdd7", 30 * _DAY)
    assert make_private_dir(str(base))  # making a private directory cleans up the legacy folder first
    assert not old.exists() and not (base / LEGACY_FOLDER).exists()


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's directory needs root")
def test_other_users_legacy_exports_are_left_alone(tmp_path: Path) -> None:
    other = _legacy_export(tmp_path / LEGACY_FOLDER, "0123456789ab-rdd7", 30 * _DAY)
    os.chown(other, 65534, 65534)
    assert remove_legacy_exports(str(tmp_path)) == [] and other.is_dir()
