"""PySpark's Python worker daemon, with torch and torchspark imported before it forks any worker.

Spark starts Python workers by forking this daemon. The stock daemon (``pyspark.daemon``) imports nothing of
ours, so every new worker pays ``import torch`` (1-2 s on a small machine) on its first task, and again whenever
Spark replaces a worker it could not reuse. With the imports done once in the daemon, a forked worker starts warm
and shares those pages copy-on-write. ``local_session`` selects it through ``spark.python.daemon.module``; a
cluster session can set the same option (the executors need torchspark installed).

Only imports happen here: no torch op runs in the daemon, so no thread pool exists to be broken by ``fork``.
Import errors are ignored: the training preflight reports a missing package with a clear message.

The imported objects are then frozen (`gc.freeze`): PySpark's daemon runs a full ``gc.collect()`` in a
reused worker after every task, and with torch imported that collection walks a few hundred thousand objects
(about 0.1 CPU-s per task, most of a small task's cost: a 2-task job took 0.25 CPU-s of the workers, 0.01 after;
a small fit's 6 tasks 0.8, 0.1 after). Frozen objects are skipped by every later collection and their pages are
not written to, so forked workers also keep sharing them copy-on-write. They are module-level objects that live
as long as the process anyway; what a worker creates after the fork is collected as usual.
"""

from __future__ import annotations

import gc
import sys


def prepare() -> None:
    """`preload`, then freeze what it imported out of the garbage collector's reach (see the module)."""
    preload()
    gc.freeze()


def preload() -> None:
    """Import what every training task needs (stdout stays untouched: it is the daemon's protocol channel)."""
    try:
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401  - what torch.optim pulls in on the first optimizer (about 1 s)

        import torchspark.spark.barrier  # noqa: F401
        import torchspark.training.worker.loop  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported by the preflight instead
        print(f"torchspark daemon: preload skipped ({type(e).__name__}: {e})", file=sys.stderr)
        return
    try:  # gradient sharing's one-pass encode (the optional ``[fast]`` extra): numba, llvmlite and what they pull in
        import torchspark.encoding._onepass_kernel  # noqa: F401  - only imported: compiling waits for a task
    except Exception:  # noqa: BLE001 - not installed or refused: the codec falls back and says why in the task
        pass


if __name__ == "__main__":
    prepare()
    from pyspark.daemon import manager

    manager()
