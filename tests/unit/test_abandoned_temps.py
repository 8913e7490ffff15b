"""Temporary names of atomic writes record their writer; the next write of the same target removes what a killed
writer left (and nothing a live writer, another host or an older version left); readers never take them for data.
Real processes that die without cleaning up, no Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import mlp_net
from torchspark import Network, optim
from torchspark._io import atomic_write_bytes
from torchspark._tmpnames import TMP_MARK, abandoned, temp_name
from torchspark.errors import SerializationError
from torchspark.training.checkpoint import complete_checkpoints, newest_checkpoint, store

# a writer killed half-way: it made its temporary file or directory, then died without finally/atexit
_WRITE_AND_DIE = """
import os, sys
from torchspark._tmpnames import temp_name
parent, name, kind = sys.argv[1:4]
tmp = os.path.join(parent, temp_name(name))
if kind == "dir":
    os.makedirs(tmp)
    open(os.path.join(tmp, "weights.safetensors"), "wb").write(b"half")
else:
    open(tmp, "wb").write(b"half")
print(tmp, flush=True)
os._exit(0)
"""


def _killed_write(parent: Path, name: str, kind: str = "file") -> Path:
    out = subprocess.run(
        [sys.executable, "-c", _WRITE_AND_DIE, str(parent), name, kind],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    return Path(out)


def _ours(parent: Path, name: str) -> Path:
    """A temporary name of a write still in progress in this (live) process."""
    path = parent / temp_name(name)
    path.write_bytes(b"writing")
    return path


def test_temp_names_tell_a_dead_writer_from_a_live_one(tmp_path: Path) -> None:
    mine = temp_name("model")
    assert mine.startswith(f".model{TMP_MARK}") and not abandoned(mine, "model")
    dead = _killed_write(tmp_path, "model").name
    assert abandoned(dead, "model")
    assert not abandoned(dead, "other")  # another target's temporary is not this one's to remove
    where, pid, _start, rand = mine[len(f".model{TMP_MARK}") :].split("-")
    assert not abandoned(f".model{TMP_MARK}{'0' * 10}-{2**22 + 7}-1-{rand}", "model")  # another host's
    assert abandoned(f".model{TMP_MARK}{where}-{pid}-1-{rand}", "model")  # our pid, another start: pid reused
    assert not abandoned(f".model{TMP_MARK}{'ab' * 16}", "model")  # an older unmarked name: cannot tell


def test_the_next_write_of_a_file_removes_only_abandoned_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    dead = _killed_write(tmp_path, "metrics.json")
    live = _ours(tmp_path, "metrics.json")
    other_target = _killed_write(tmp_path, "stats.json")
    unmarked = tmp_path / f".metrics.json{TMP_MARK}{'ab' * 16}"
    unmarked.write_bytes(b"old")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    planted = tmp_path / _killed_write(tmp_path, "metrics.json").name
    planted.unlink()
    planted.symlink_to(victim)  # a dead writer's name, but a symlink: not ours to follow or remove
    atomic_write_bytes(str(target), b"{}", OSError)
    assert target.read_bytes() == b"{}" and not dead.exists()
    assert live.exists() and other_target.exists() and unmarked.exists() and planted.is_symlink()
    assert victim.read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["metrics.json", live.name, other_target.name, unmarked.name, planted.name, "victim"]
    )


def test_the_next_save_of_a_model_removes_the_directory_a_killed_save_left(tmp_path: Path) -> None:
    dead = _killed_write(tmp_path, "model", "dir")
    other = _killed_write(tmp_path, "model2", "dir")
    assert (dead / "weights.safetensors").exists()
    net = mlp_net(4, 8, 3, updater=optim.SGD(lr=0.1), seed=1)
    net.save(str(tmp_path / "model"))
    assert not dead.exists() and other.exists()
    assert torch.equal(Network.load(str(tmp_path / "model")).params(), net.params())
    with pytest.raises(SerializationError, match="config.json"):  # the leftover is never a model: no config
        Network.load(str(other))


def test_checkpoint_temporaries_are_never_checkpoints_and_go_on_the_next_write(tmp_path: Path) -> None:
    root = str(tmp_path)

    def record(step: int, rank: int) -> dict:  # what a worker records (the resume checks every count)
        return {
            "rank": rank,
            "step": step,
            "fit_epoch": 0,
            "done": 0,
            "iteration": 0,
            "epoch": 0,
            "examples": 0,
            "iterations": 0,
        }

    def manifest(step: int) -> dict:
        return {
            "world_size": 2,
            "step": step,
            "fit_epoch": 0,
            "iteration": 0,
            "epoch": 0,
            "mode": "averaging",
            "settings": {},
        }

    first = store.step_directory(root, "r", 1)
    for rank in (0, 1):
        store.write_rank_file(first, rank, {"x": torch.zeros(2)}, record(1, rank))
    store.write_manifest(first, manifest(1))
    second = store.step_directory(root, "r", 2)  # rank 1 was killed while writing its file
    store.write_rank_file(second, 0, {"x": torch.ones(2)}, record(2, 0))
    store.write_manifest(second, manifest(2))
    leftover = _killed_write(Path(second), "rank-1.safetensors")
    _killed_write(tmp_path / "r", "step-0000000003", "dir")  # a step-like temporary directory in the run
    assert [c.step for c in complete_checkpoints(root, "r")] == [1]
    assert newest_checkpoint(root, "r").step == 1
    store.write_rank_file(second, 1, {"x": torch.ones(2)}, record(2, 1))  # the same rank writes that file again
    assert not leftover.exists()
    assert sorted(os.listdir(second)) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
    assert newest_checkpoint(root, "r").step == 2
    assert json.loads((Path(second) / "manifest.json").read_text())["world_size"] == 2
