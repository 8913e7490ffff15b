"""What the ``torchspark train`` command refuses for its size, and how it keeps a trained model it cannot write.

* `check_scale`: ``--epochs`` at most `MAX_EPOCHS` (``--epochs 1e8`` is a typo, not a plan; it once
  ran out of memory after 44 s; the library now refuses only ``shuffle_scope="global"`` plans that large), and on this machine (``--parallel`` or a ``local`` master) ``--num-workers`` at
  most `max_local_workers` (each worker holds a process or task, sockets and files open on the driver:
  ``--num-workers 100000`` ended in "too many open files");
* `save_model`: the final model is written atomically (``Network.save``: a temporary directory renamed into
  place), so a full disk never leaves half a model; when it cannot be written there it is saved under the system's
  temporary directory instead and the error says where (the training is not lost).

Example::

    check_scale(args)                       # ConfigError naming the option, the value and the fix
    path = save_model(net, "out/model")     # "out/model", or SetupError naming the fallback copy
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import tempfile
from typing import Any

from torchspark.errors import ConfigError, SerializationError, SetupError

__all__ = ["MAX_EPOCHS", "FDS_PER_WORKER", "max_local_workers", "check_scale", "save_model"]

#: the most epochs one ``train`` run takes (run again with the saved model to train longer)
MAX_EPOCHS = 100_000
#: file descriptors the driver holds per local worker (process pipes, progress and rendezvous sockets, files)
FDS_PER_WORKER = 16

_LOCAL = re.compile(r"local(\[.*\])?$")


def max_local_workers() -> int:
    """Workers this machine can run at once: its open-file limit divided by `FDS_PER_WORKER`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(1, limit // FDS_PER_WORKER)


def check_scale(args: argparse.Namespace) -> None:
    """Refuse ``--epochs`` and (on this machine) ``--num-workers`` that cannot run.

    Raises:
        ConfigError: the option, the value, the bound and the fix.
    """
    epochs = getattr(args, "epochs", None)
    if epochs is not None and epochs > MAX_EPOCHS:
        raise ConfigError(
            f"--epochs must be at most {MAX_EPOCHS}, got {epochs}: train in several runs (each continues the "
            "saved model's counters)"
        )
    workers = getattr(args, "num_workers", None)
    master = getattr(args, "master", None)
    on_this_machine = getattr(args, "parallel", False) or master is None or bool(_LOCAL.match(str(master)))
    if workers is not None and on_this_machine and workers > max_local_workers():
        raise ConfigError(
            f"--num-workers {workers} cannot run on this machine: its open-file limit (ulimit -n "
            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}) allows at most {max_local_workers()} "
            f"workers ({FDS_PER_WORKER} files each); use fewer workers, raise ulimit -n, or pass "
            "--master of a cluster"
        )


def save_model(network: Any, model_dir: str) -> str:
    """``network.save(model_dir)`` (atomic: a temporary directory renamed into place); returns ``model_dir``.

    Raises:
        SetupError: it could not be written there (full disk, removed directory); the message names the error and
            the directory under the system's temporary directory where the trained model was saved instead.
    """
    try:
        network.save(model_dir)
        return model_dir
    except (OSError, SerializationError) as e:
        kept = os.path.join(tempfile.mkdtemp(prefix="torchspark-model-"), "model")
        network.save(kept)
        raise SetupError(
            f"cannot write the trained model to {model_dir!r} ({e}); it was saved to {kept!r} instead: "
            "move it from there"
        ) from e
