"""Exports under an explicit ``export_directory`` record their driver; the next export there removes those of this
host's drivers that are gone, and nothing else. Real processes, local and memory:// filesystems, no Spark."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from torchspark.spark.export import export_name, mark_export, remove_dead_exports
from torchspark.spark.private_dirs import OWNER_FILE, owner_record

_RECORD_AND_DIE = """
import json
from torchspark.spark.private_dirs import owner_record
print(json.dumps(owner_record()), flush=True)
import os
os._exit(0)  # as a killed driver: nothing removes its export
"""


def _dead_owner() -> dict:
    """The owner record of a driver process that has exited."""
    out = subprocess.run(
        [sys.executable, "-c", _RECORD_AND_DIE], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return json.loads(out)


def _export(base: str, rdd_id: int, owner: dict | None = None) -> str:
    fs, root = fsspec.core.url_to_fs(base)
    directory = f"{base.rstrip('/')}/{export_name(rdd_id)}"
    fs.makedirs(fsspec.core.url_to_fs(directory)[1], exist_ok=True)
    fs.pipe(fsspec.core.url_to_fs(f"{directory}/part00000-ab_000000.safetensors")[1], b"batch")
    if owner is not None:
        fs.pipe(fsspec.core.url_to_fs(f"{directory}/{OWNER_FILE}")[1], json.dumps(owner).encode())
    return directory


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_only_exports_of_gone_drivers_of_this_host_are_removed(tmp_path: Path, scheme: str) -> None:
    base = str(tmp_path / "exports") if scheme == "local" else f"memory://{tmp_path.name}/exports"
    dead = _export(base, 1, _dead_owner())
    live = _export(base, 2)
    mark_export(live)  # this process: running
    elsewhere = _export(base, 3, {**owner_record(), "pid": 2**22 + 7, "host": socket.gethostname() + "-other"})
    unmarked = _export(base, 4)  # an older version's export, or not ours: no record, left alone
    fs, root = fsspec.core.url_to_fs(base)
    fs.makedirs(f"{root}/my-data", exist_ok=True)  # not an export's name
    assert remove_dead_exports(base) == [dead]
    names = sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert names == sorted(d.rsplit("/", 1)[-1] for d in (live, elsewhere, unmarked)) + ["my-data"]
    assert remove_dead_exports(base + "/missing") == []


def test_a_planted_symlink_with_an_exports_name_is_not_followed(tmp_path: Path) -> None:
    victim = Path(_export(str(tmp_path / "victim"), 1, _dead_owner()))
    (tmp_path / "exports").mkdir()
    os.symlink(victim, tmp_path / "exports" / victim.name)
    assert remove_dead_exports(str(tmp_path / "exports")) == []
    assert (victim / "part00000-ab_000000.safetensors").exists()
