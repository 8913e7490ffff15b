"""Model saves are atomic: the whole directory is written under a temporary name, then swapped in.

The full-disk case runs on a real, small tmpfs (mounting needs root; skipped with the reason otherwise).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from helpers import mlp_net
from torchspark import Network, optim
from torchspark.errors import SerializationError


def _net(seed: int, hidden: int = 8) -> Network:
    return mlp_net(64, hidden, 10, updater=optim.Adam(lr=1e-3), seed=seed)


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def test_saving_over_a_model_replaces_it_and_leaves_no_temporaries(tmp_path: Path) -> None:
    path = tmp_path / "model"
    _net(0).save(str(path))
    (path / ".config.json.tmp-old").write_bytes(b"x")  # a temp file an older torchspark left: replaceable
    second = _net(1)
    second.save(str(path), save_updater=False)
    assert sorted(os.listdir(tmp_path)) == ["model"]
    assert sorted(os.listdir(path)) == ["config.json", "weights.safetensors"]  # the old updater file is gone
    assert torch.equal(Network.load(str(path)).params(), second.params())


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        (
            lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")),
            "holds files that are not part of a saved network (['notes.txt'])",
        ),
        (
            lambda p: (p.mkdir(), (p / "weights.safetensors").write_bytes(b"x")),
            "is not empty and holds no saved network",
        ),
        (lambda p: p.write_text("a file"), "exists and is not a directory"),
    ],
)
def test_save_refuses_to_replace_what_is_not_a_model(tmp_path: Path, setup, fragment: str) -> None:
    path = tmp_path / "target"
    setup(path)
    before = {f.name: f.read_bytes() for f in path.iterdir()} if path.is_dir() else path.read_bytes()
    with pytest.raises(SerializationError) as info:
        _net(0).save(str(path))
    assert fragment in str(info.value) and str(path) in str(info.value)
    after = {f.name: f.read_bytes() for f in path.iterdir()} if path.is_dir() else path.read_bytes()
    assert after == before
    assert sorted(os.listdir(tmp_path)) == ["target"]


def test_empty_directory_and_memory_filesystem(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    net = _net(0)
    net.save(str(tmp_path / "empty"))
    assert torch.equal(Network.load(str(tmp_path / "empty")).params(), net.params())
    url = f"memory://atomic-{uuid.uuid4().hex}/m"
    _net(1).save(url)
    net.save(url)
    assert torch.equal(Network.load(url).params(), net.params())


@pytest.fixture()
def small_tmpfs(tmp_path: Path):
    """A tmpfs of 160 KiB at ``tmp_path/disk``: room for one small model (~100 KB) but not for two."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the full-disk test writes to a real, tiny filesystem)")
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=160k,mode=0700", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_leaves_the_old_model_whole(small_tmpfs: Path) -> None:
    path = small_tmpfs / "model"
    old = _net(0, hidden=128)  # ~9.6k parameters: ~39 KB weights + ~77 KB Adam state
    old.save(str(path))
    assert 80_000 < _dir_size(path) < 160 * 1024
    new = _net(1, hidden=128)
    with pytest.raises(SerializationError) as info:
        new.save(str(path))
    message = str(info.value)
    assert "the disk is full" in message and "unchanged" in message and str(path) in message
    assert sorted(os.listdir(small_tmpfs)) == ["model"]  # the half-written temporary directory is gone
    loaded = Network.load(str(path))
    assert torch.equal(loaded.params(), old.params()) and not torch.equal(loaded.params(), new.params())
    assert torch.equal(loaded.updater_state(), old.updater_state())
    small = _net(2)  # a small model fits next to the old one: the failed save gave its space back
    small.save(str(path))
    assert torch.equal(Network.load(str(path)).params(), small.params())
    assert sorted(os.listdir(small_tmpfs)) == ["model"]
