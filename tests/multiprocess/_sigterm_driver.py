"""A driver process for the SIGTERM test: a long ParallelWrapper fit whose workers are slow (module level, so the
workers import the model by name). Usage: ``python _sigterm_driver.py``; it runs until it is terminated."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _slow, for the workers too

from _slow import SlowOnRank  # noqa: E402

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.parallel import LocalProcessRunner, ParallelWrapper  # noqa: E402

if __name__ == "__main__":
    data = datasets.synthetic_classification(512, 8, 2, seed=0)
    net = Network(SlowOnRank(models.mlp(8, 8, 2), slow_rank=0, delay_s=0.2), updater=optim.SGD(lr=0.1), seed=0)
    runner = LocalProcessRunner(["cpu", "cpu"], threads_per_worker=1)
    wrapper = ParallelWrapper(net, num_workers=2, training_mode="averaging", progress=False, runner=runner)
    wrapper.fit(data, epochs=1000, batch_size=8)
