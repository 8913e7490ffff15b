"""The environment variables torchspark reads or sets, in one place, and a scope that restores what a task set.

PySpark reuses Python workers between tasks (``spark.python.worker.reuse``), so a variable one fit's task sets
(``GLOO_SOCKET_IFNAME`` for a loopback rendezvous) would otherwise leak into every later task on that worker.
Tasks set variables only through a `TaskEnvironment`, which puts back the previous values on exit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["LOCAL_IP", "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "GPU_DRY_RUN", "read", "TaskEnvironment"]

#: overrides the address an executor advertises to its peers (DL4J's ``DL4J_VOID_IP``)
LOCAL_IP = "TORCHSPARK_LOCAL_IP"
#: the GPUs this process may use (read to pick a task's device)
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: the interface gloo uses; a task sets it to ``lo`` when its peers talk over loopback
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
#: a testing aid, read on the driver when a Spark fit starts: ``1`` makes tasks Spark gave a GPU record its address
#: and train on the CPU (GPU scheduling tested with a fake discovery script on a machine without CUDA); see
#: `torchspark.spark.gpus.dry_run_requested`
GPU_DRY_RUN = "TORCHSPARK_GPU_DRY_RUN"


def read(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of ``name`` (None when unset or empty) in ``env`` (default: this process's environment)."""
    value = (os.environ if env is None else env).get(name)
    return value or None


class TaskEnvironment:
    """Set variables for the length of a task, then restore each to its value before the task (or unset it).

    Usage: ``with TaskEnvironment() as env: env.setdefault(GLOO_SOCKET_IFNAME, "lo"); ...``.
    """

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, name: str, value: str | None) -> None:
        """Set ``name`` to ``value`` (None = unset) until the scope ends."""
        if name not in self._saved:
            self._saved[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def setdefault(self, name: str, value: str | None) -> None:
        """Set ``name`` to ``value`` unless the user already set it (None = leave it alone)."""
        if value is not None and not os.environ.get(name):
            self.set(name, value)

    def restore(self) -> None:
        """Put every variable this scope changed back as it was. Idempotent."""
        saved, self._saved = self._saved, {}
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def __enter__(self) -> TaskEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
