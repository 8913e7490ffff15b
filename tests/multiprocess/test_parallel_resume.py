"""Resume by run id from a new driver process: a ParallelWrapper fit (real worker processes) interrupted mid-epoch by
a worker fault, continued by a second driver process calling the same fit with the same run id, ends with the
parameters of an uninterrupted fit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _resume_driver import data, fit
from safetensors.torch import load_file

from torchspark.errors import ConfigError, WorkerError
from torchspark.training.checkpoint import newest_checkpoint, store

DRIVER = os.path.join(os.path.dirname(__file__), "_resume_driver.py")
PER_WORKER = 6


def _driver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, DRIVER, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(1800)  # two driver processes, each bounded at 600 s
@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_a_second_driver_process_continues_the_run(tmp_path, mode: str) -> None:
    directory = str(tmp_path / "ckpt")
    # the reference: one uninterrupted fit without checkpoints, the driver script's fit run in this process (a
    # driver process of its own would only add an interpreter start)
    net = fit(mode, None, None, None)
    want = {
        "params": net.params(),
        "updater": net.updater_state(),
        "counters": torch.tensor([net.iteration, net.epoch]),
    }

    first = _driver(mode, directory, "r1", "16", str(tmp_path / "first.safetensors"))
    assert first.returncode == 3 and "worker stopped after 16 minibatches" in first.stderr, first.stderr
    cut = newest_checkpoint(directory, "r1")
    done = store.read_rank_file(cut.path, 0)[1]["done"]
    assert cut.manifest["fit_epoch"] == 2 and 0 < done < PER_WORKER  # interrupted inside the last epoch

    # the new driver's workers stop after the minibatches the first one had left: only those are trained
    second = _driver(mode, directory, "r1", str(PER_WORKER - done), str(tmp_path / "second.safetensors"))
    assert second.returncode == 0, second.stderr
    got = load_file(str(tmp_path / "second.safetensors"))
    if mode == "averaging":
        torch.testing.assert_close(got["params"], want["params"], rtol=0, atol=1e-6)
    else:
        assert torch.equal(got["params"], want["params"])
    torch.testing.assert_close(got["updater"], want["updater"], rtol=0, atol=1e-6)
    assert got["counters"].tolist() == want["counters"].tolist()


@pytest.mark.timeout(900)
def test_worker_processes_refuse_a_mid_epoch_resume_whose_data_changed(tmp_path) -> None:
    """The worker processes receive their share serialized and read it once in the first epoch (its length unknown
    up front): a cut inside the first epoch used to record no length and any resume was accepted (the issue's
    batch_size 20 -> 22: 80 of 400 examples untrained, 50 twice). Each change below keeps the cut's minibatch
    count, so only the fingerprint of the minibatches trained before the cut tells."""
    directory = str(tmp_path / "ckpt")
    with pytest.raises(WorkerError, match="worker stopped after 3 minibatches"):
        fit("averaging", directory, "r1", 3, epochs=1)
    cut = newest_checkpoint(directory, "r1")
    meta = store.read_rank_file(cut.path, 0)[1]
    assert (cut.manifest["fit_epoch"], meta["done"], meta["epoch_length"]) == (0, 3, None)  # a stream: no length

    changes = {
        "batch size": (dict(batch_size=18), "the batch size or the data size changed"),
        "data size": (dict(train=data().slice(0, 190)), "the batch size or the data size changed"),
        "order": (dict(train=data().shuffle(7)), "the data order or content changed"),
    }
    for name, (change, match) in changes.items():
        with pytest.raises(ConfigError, match=f"cut after 3 minibatches of epoch 0.*{match}"):
            fit("averaging", directory, "r1", None, epochs=1, **change)
        assert newest_checkpoint(directory, "r1").path == cut.path, name  # refused before training anything
    fit("averaging", directory, "r1", PER_WORKER - 3, epochs=1)  # the same data resumes: only what was left
