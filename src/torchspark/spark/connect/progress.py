"""How live progress reaches a Spark Connect client: the channel a fit on a Connect session uses.

A classic driver runs inside the cluster, so workers stream progress to a TCP port on it. A Connect client may sit
outside the cluster's network (a laptop, a notebook service); executors cannot connect to it. Then the workers
write their progress, heartbeats, scores and tracebacks as files into a directory every executor and the client
can reach, and the client polls it (`torchspark.training.progress.files`). Both channels feed the same
progress bar, progress and training listeners (MLflow, TensorBoard) and liveness watchdog.

=============  ============================================================================================
channel        what it does
=============  ============================================================================================
``"auto"``     ``"tcp"`` when the Connect server runs on this machine (loopback), else ``"directory"`` when a
               directory is known (``progress_directory``, or the run's checkpoint directory), else ``"none"``
               with a logged warning naming ``progress_directory``
``"tcp"``      the driver's progress server; only when the executors can connect to this client
``"directory"`` files under ``progress_directory`` (or ``<checkpoint_directory>/<run_id>/progress``)
``"none"``     no live progress: no bar, no listener events during the fit, no heartbeat watchdog; a worker's
               error still comes back in Spark's error text
=============  ============================================================================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torchspark._io import join
from torchspark.errors import ConfigError
from torchspark.training.checkpoint import CheckpointPlan
from torchspark.training.checkpoint.store import run_directory
from torchspark.validation import check_choice, check_float

__all__ = ["ConnectProgress", "CHANNELS", "check_channel", "choose_channel", "progress_base", "open_channel"]

log = logging.getLogger(__name__)

#: the values of ``progress_channel``
CHANNELS = ("auto", "tcp", "directory", "none")


@dataclass(frozen=True)
class ConnectProgress:
    """The progress channel of fits on a Spark Connect session (``SparkNetwork(..., progress_channel=...)``).

    Args:
        channel: ``"auto"`` (default), ``"tcp"``, ``"directory"`` or ``"none"`` (the module's table).
        directory: where workers write progress files: any fsspec URL every executor can write and the client can
            list and read (``"s3://bucket/torchspark/progress"``, a shared mount). Each fit writes in a fresh
            subdirectory, removed when the fit succeeds. None: under the run's checkpoint directory when the master
            has one.
        poll_s: seconds between two listings of the directory by the client (and between two writes by each
            worker). 1 s keeps the bar live; on an object store each poll is one LIST request, so raise it for a
            long fit with a costly store.

    Example: ``ConnectProgress("directory", "s3://bucket/progress", poll_s=2.0)``.

    Raises:
        ConfigError: an unknown channel, a ``poll_s`` that is not a positive number, a directory that is not a
            non-empty string, or a directory with ``"tcp"``/``"none"`` (it would be ignored).
    """

    channel: str = "auto"
    directory: str | None = None
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        check_choice(
            "progress_channel",
            self.channel,
            CHANNELS,
            owner="SparkNetwork",
            fix="'directory' for a client the executors cannot reach",
        )
        check_float("progress_poll_s", self.poll_s, minimum=0.01, maximum=3600.0, owner="SparkNetwork", unit="seconds")
        if self.directory is not None and (not isinstance(self.directory, str) or not self.directory.strip()):
            raise ConfigError(
                f"SparkNetwork: progress_directory must be a non-empty URL string (e.g. "
                f"'s3://bucket/progress') or None, got {self.directory!r}"
            )
        if self.directory is not None and self.channel in ("tcp", "none"):
            raise ConfigError(
                f"SparkNetwork: progress_directory={self.directory!r} is unused with "
                f"progress_channel={self.channel!r}; use progress_channel='directory' (or 'auto'), "
                "or drop progress_directory"
            )


def progress_base(setting: ConnectProgress, checkpoint: CheckpointPlan | None) -> str | None:
    """The directory a fit's progress files go under: ``setting.directory``, else the run's checkpoint directory's
    ``progress`` folder, else None."""
    if setting.directory is not None:
        return setting.directory
    if checkpoint is not None:
        return join(run_directory(checkpoint.directory, checkpoint.run_id), "progress")
    return None


def check_channel(setting: ConnectProgress, checkpoint_directory: str | None) -> None:
    """Refuse ``"directory"`` without a place for it before any query runs (the master's
    ``checkpoint_directory`` is the other place).

    Raises:
        ConfigError: as `choose_channel` does.
    """
    if setting.channel == "directory" and setting.directory is None and checkpoint_directory is None:
        choose_channel(setting, False, None)


def choose_channel(setting: ConnectProgress, client_local: bool, base: str | None) -> str:
    """The channel a fit uses (``"tcp"``, ``"directory"`` or ``"none"``), from the setting, whether the Connect
    server runs on this machine and the directory `progress_base` found.

    Raises:
        ConfigError: ``"directory"`` without a directory (names ``progress_directory`` and the checkpoint option).
    """
    if setting.channel == "directory" and base is None:
        raise ConfigError(
            "progress_channel='directory' needs a directory every executor and this client can reach: "
            "set SparkNetwork(..., progress_directory='s3://bucket/progress') or the master's "
            "checkpoint_directory"
        )
    if setting.channel != "auto":
        return setting.channel
    if client_local:
        return "tcp"
    if base is not None:
        return "directory"
    log.warning(
        "no live progress: the Spark Connect server is not on this machine, so its executors cannot reach "
        "this client's progress port; set SparkNetwork(..., progress_directory='<a URL every executor and "
        "this client can reach>') for the bar, listeners and heartbeats (worker errors still come back in "
        "Spark's error)"
    )
    return "none"


def open_channel(
    channel: str, setting: ConnectProgress, base: str | None, context: Any, port_range: tuple[int, int] | None
) -> Any:
    """What the workers get for ``channel`` from the fit's context: a TCP endpoint, a progress directory, or
    None."""
    if channel == "tcp":
        return context.progress_address(port_range=port_range)
    if channel == "directory":
        assert base is not None
        return context.progress_directory(base, poll_s=setting.poll_s, flush_s=setting.poll_s)
    return None
