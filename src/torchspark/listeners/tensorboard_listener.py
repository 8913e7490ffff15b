"""TensorBoard event files for torchspark fits (the ``[tensorboard]`` extra: ``pip install 'torchspark[tensorboard]'``).

Written with tensorboardX's ``SummaryWriter`` (numpy + protobuf only; no TensorFlow and no TensorBoard server
needed to write): ``tensorboard --logdir LOGDIR`` shows them. Tags:

* per progress report (step = the network's iteration): ``train/score``, ``train/examples_per_second`` and, for
  gradient sharing, ``sharing/bytes_sent`` and ``sharing/compression`` (dense bytes / bytes sent, so far);
* per epoch (step = the network's epoch): ``epoch/score``, ``epoch/examples_per_second``, ``epoch/seconds`` and
  ``epoch/bytes_sent``;
* at the start, the master's and network's settings as the text ``config/master`` / ``config/network``.

[`read_scalars`][torchspark.listeners.tensorboard_listener.read_scalars] reads the scalars of an event directory back (no TensorBoard install needed).
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Any

from torchspark.errors import ConfigError, DataError
from torchspark.listeners.events import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingListener
from torchspark.listeners.places import check_directory

__all__ = ["TensorBoardListener", "read_scalars"]


def _tensorboardx() -> Any:
    try:
        import tensorboardX
    except ImportError as e:
        raise ConfigError("TensorBoardListener needs tensorboardX: pip install 'torchspark[tensorboard]'") from e
    return tensorboardX


class TensorBoardListener(TrainingListener):
    """Writes each fit's scalars to TensorBoard event files under ``log_dir``.

    Args:
        log_dir: the event directory (one ``events.out.tfevents.*`` file per listener; later fits append, their
            steps continuing from the network's counters).
        every: write the per-iteration scalars every this many progress reports (1 = all). Workers report every
            ``progress_every`` minibatches already; raise it for very long fits.
    The writer flushes to disk every 10 seconds and at the end of every fit.

    Raises:
        ConfigError: ``log_dir`` cannot be created or written (a file in the way, a read-only parent).
    """

    def __init__(self, log_dir: str | os.PathLike[str], every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"TensorBoardListener: every must be an integer >= 1, got {every!r}")
        self.log_dir = check_directory(log_dir, "TensorBoardListener log_dir")
        self.every = every
        self.writer = _tensorboardx().SummaryWriter(logdir=self.log_dir, flush_secs=10)
        self._reports = 0

    def on_fit_start(self, event: FitStarted) -> None:
        self._reports = 0
        self.writer.add_text("config/master", json.dumps(event.master, indent=1, default=str), event.start_epoch)
        self.writer.add_text("config/network", json.dumps(event.network, indent=1, default=str), event.start_epoch)

    def on_iteration(self, event: IterationEvent) -> None:
        self._reports += 1
        if (self._reports - 1) % self.every:
            return
        step = event.iteration
        self.writer.add_scalar("train/score", event.score, step)
        self.writer.add_scalar("train/examples_per_second", event.examples_per_second, step)
        if event.bytes_sent:
            self.writer.add_scalar("sharing/bytes_sent", event.bytes_sent, step)
            self.writer.add_scalar("sharing/compression", event.dense_bytes / event.bytes_sent, step)

    def on_epoch_end(self, event: EpochEvent) -> None:
        self.writer.add_scalar("epoch/score", event.score, event.epoch)
        self.writer.add_scalar("epoch/examples_per_second", event.examples_per_second, event.epoch)
        self.writer.add_scalar("epoch/seconds", event.seconds, event.epoch)
        if event.dense_bytes:
            self.writer.add_scalar("epoch/bytes_sent", event.bytes_sent, event.epoch)

    def on_fit_end(self, event: FitEnded) -> None:
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def _records(path: str) -> list[bytes]:
    """The records of one TFRecord file: ``u64 length, u32 masked crc(length), data, u32 masked crc(data)``."""
    from tensorboardX.crc32c import crc32c

    def masked(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out: list[bytes] = []
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if not header:
                return out
            if len(header) < 12:
                raise DataError(f"{path}: truncated record header")
            (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            if masked(header[:8]) != length_crc:
                raise DataError(f"{path}: bad record length checksum")
            data, footer = f.read(length), f.read(4)
            if len(data) < length or len(footer) < 4 or masked(data) != struct.unpack("<I", footer)[0]:
                raise DataError(f"{path}: truncated or corrupt record")
            out.append(data)


def read_scalars(log_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``log_dir``: ``{tag: [(step, value), ...]}`` in write order.

    Raises:
        DataError: no event file in ``log_dir``, or a corrupt one.
    """
    _tensorboardx()
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(glob.glob(os.path.join(os.fspath(log_dir), "events.out.tfevents.*")))
    if not files:
        raise DataError(f"no TensorBoard event file (events.out.tfevents.*) in {os.fspath(log_dir)!r}")
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        for record in _records(path):
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.WhichOneof("value") == "simple_value":
                    scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return scalars
