"""A driver process for the resume test: one ParallelWrapper fit of run ``run_id``, its parameters saved to a file.

Usage: ``python _resume_driver.py MODE CHECKPOINT_DIR RUN_ID AFTER OUT`` (``CHECKPOINT_DIR`` ``none``: a fit without
checkpoints, and no run id); ``AFTER`` is the minibatches each worker
trains before it stops (``none``: never). Exit code 3 when the fit was interrupted (the worker's error on stderr).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the tests folder: interrupting

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from helpers import averaging_only  # noqa: E402
from interrupting import InterruptingMLP  # noqa: E402
from torchspark import DataSet, Network, optim  # noqa: E402
from torchspark.errors import WorkerError  # noqa: E402
from torchspark.parallel import ParallelWrapper  # noqa: E402

EPOCHS = 3
BATCH = 16  # 192 examples, 2 workers: 6 minibatches per worker and epoch


def data() -> DataSet:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(192, 12, generator=g)
    y = torch.nn.functional.one_hot((x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long(), 3).float()
    return DataSet(x, y)


def fit(
    mode: str,
    directory: str | None,
    run_id: str | None,
    after: int | None,
    train: DataSet | None = None,
    batch_size: int = BATCH,
    epochs: int = EPOCHS,
) -> Network:
    net = Network(InterruptingMLP(12, 16, 3, after=after), updater=optim.Adam(lr=0.01), seed=0)
    checkpoints = (
        {}
        if directory is None
        else {"checkpoint_directory": directory, "checkpoint_every": 1 if mode == "averaging" else 2}
    )
    ParallelWrapper(
        net,
        num_workers=2,
        training_mode=mode,
        **averaging_only(mode, 3),
        threads_per_worker=1,
        progress=False,
        **checkpoints,
    ).fit(data() if train is None else train, epochs=epochs, batch_size=batch_size, run_id=run_id)
    return net


def main() -> int:
    mode, directory, run_id, after, out = sys.argv[1:6]
    try:
        plain = directory == "none"
        net = fit(
            mode, None if plain else directory, None if plain else run_id, None if after == "none" else int(after)
        )
    except WorkerError as e:
        print(str(e), file=sys.stderr)
        return 3
    save_file(
        {"params": net.params(), "updater": net.updater_state(), "counters": torch.tensor([net.iteration, net.epoch])},
        out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
