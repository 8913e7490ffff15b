"""The GPU check's resume row: a fit with dropout on the device, interrupted mid-epoch and resumed by run id from a
differently seeded process state, ends bit for bit where the uninterrupted fit ends -- the checkpoint restores
the device's random stream (``rng.cuda``), not only the CPU's. One worker in this process (its random stream is
the process's own), parameter averaging, a checkpoint every round.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from torch import nn

from torchspark import Network, optim
from torchspark.data import DataSet

__all__ = ["checkpoint_resume"]


class _Stop(Exception):
    """The fault: the worker stops after ``after`` training minibatches."""


class _DropoutMLP(nn.Module):
    def __init__(self, after: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 4))
        self.after, self.calls = after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.after is not None:
            self.calls += 1
            if self.calls > self.after:
                raise _Stop(f"worker stopped after {self.after} minibatches")
        return self.net(x)


def _fit(device: str, directory: str, data: DataSet, after: int | None, run_id: str | None) -> Network:
    from torchspark.parallel import ParallelWrapper
    from torchspark.training.driver.runner import InProcessRunner

    net = Network(_DropoutMLP(after), updater=optim.Adam(lr=1e-3), seed=0, device=device)
    ParallelWrapper(
        net,
        num_workers=1,
        devices=[device],
        averaging_frequency=2,
        progress=False,
        runner=InProcessRunner(timeout_s=120),
        checkpoint_directory=directory,
        checkpoint_every=1,
    ).fit(data, epochs=2, batch_size=32, run_id=run_id)
    return net


def checkpoint_resume(ctx: Any) -> list[dict[str, Any]]:
    from _gpu_checks import _data, row

    data = _data(ctx.pick(256, 512, 2048), 32, 4, seed=5)
    steps = len(data) // 32
    with tempfile.TemporaryDirectory() as ref_dir, tempfile.TemporaryDirectory() as run_dir:
        torch.manual_seed(11)
        reference = _fit(ctx.device, ref_dir, data, None, None)
        torch.manual_seed(11)
        stopped = ""
        try:
            _fit(ctx.device, run_dir, data, steps + steps // 2, "r1")  # inside epoch 2
        except Exception as e:  # noqa: BLE001 - the worker's stop comes back as a WorkerError
            stopped = type(e).__name__
        torch.manual_seed(12345)  # another process state: the resumed streams must come from the checkpoint
        if ctx.cuda:
            torch.cuda.manual_seed_all(12345)
        resumed = _fit(ctx.device, run_dir, data, None, "r1")
    equal = torch.equal(resumed.params().cpu(), reference.params().cpu())
    ok = bool(stopped) and equal
    text = (
        f"dropout fit on {ctx.device} stopped mid-epoch ({stopped or 'did not stop'}) and resumed by run id: "
        f"parameters {'bit-equal' if equal else 'DIFFER'} to the uninterrupted fit"
    )
    return [
        row(
            "checkpoint_resume",
            ctx.device,
            "pass" if ok else "fail",
            text,
            stopped=stopped,
            bit_equal=equal,
            steps_per_epoch=steps,
        )
    ]
