"""Resume by run id from a new driver process: a ParallelWrapper fit (real worker processes) interrupted mid-epoch by
a worker fault, continued by a second driver process calling the same fit with the same run id, ends with the
parameters of an uninterrupted fit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _resume_driver import fit
from safetensors.torch import load_file

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
