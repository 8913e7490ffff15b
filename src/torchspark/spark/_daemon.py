"""PySpark's Python worker daemon, with torch and torchspark imported before it forks any worker.

Spark starts Python workers by forking this daemon. The stock daemon (``pyspark.daemon``) imports nothing of
ours, so every new worker pays ``import torch`` (1-2 s on a small machine) on its first task, and again whenever
Spark replaces a worker it could not reuse. With the imports done once in the daemon, a forked worker starts warm
and shares those pages copy-on-write. ``local_session`` selects it through ``spark.python.daemon.module``; a
cluster session can set the same option (the executors need torchspark installed).

Only imports happen here: no torch op runs in the daemon, so no thread pool exists to be broken by ``fork``.
Import errors are ignored: the training preflight reports a missing package with a clear message.
"""

from __future__ import annotations

import sys


def preload() -> None:
    """Import what every training task needs (stdout stays untouched: it is the daemon's protocol channel)."""
    try:
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401  - what torch.optim pulls in on the first optimizer (about 1 s)

        import torchspark.spark.barrier  # noqa: F401
        import torchspark.training.worker.loop  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported by the preflight instead
        print(f"torchspark daemon: preload skipped ({type(e).__name__}: {e})", file=sys.stderr)


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
