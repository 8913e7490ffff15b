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

from torchspark.spark.private_dirs import OWNER_FILE, PREFIX, make_private_dir, remove_dirs, remove_stale

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
    dead = subprocess.run([sys.executable, "-c", _MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()
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
        [os.path.basename(live), os.path.basename(elsewhere), unmarked.name, "victim", f"{PREFIX}link"])
    assert (target / "keep").exists()
