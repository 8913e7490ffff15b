"""One fit per run at a time: a lock file in the run's directory.

Two fits with the same ``run_id`` at once would interleave their checkpoints (each resuming from, and pruning, the
other's). The driver therefore holds ``<checkpoint_directory>/<run_id>/run.lock`` for the whole fit: a JSON record
of who holds it (host, pid and the process's start time). A second fit of the run is refused with a
[`ConfigError`][torchspark._io.ConfigError] naming the holder. A lock whose holder is gone (the same host, a process
that no longer runs: a driver killed with ``kill -9``) is stale and taken over; one held on another host cannot be
checked from here, so the message says which file to delete once that fit is known to be gone.

On local storage the lock is taken with ``O_CREAT | O_EXCL`` (atomic); on other fsspec storage with an existence
check and an atomic write, which a second driver starting in the same instant may race (object stores offer no
exclusive create through fsspec).

Example::

    lock = acquire_run_lock("/data/ckpt", "r1")   # ConfigError: "run 'r1' is being trained by pid 4121 on ..."
    try:
        ...  # the fit
    finally:
        lock.release()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs, read_bytes
from torchspark._process import host_identity, is_running, start_time
from torchspark.errors import ConfigError

__all__ = ["LOCK_FILE", "RunLock", "acquire_run_lock"]

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


@dataclass
class RunLock:
    """A held run lock; `release` deletes its file (only if it is still ours)."""

    url: str
    record: dict[str, Any]

    def release(self) -> None:
        """Give the run free for the next fit (a lock another process took over meanwhile is left alone)."""
        fs, path = filesystem(self.url)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(fs.cat_file(path)) == self.record:
                fs.rm(path)


def _record() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": host_identity(), "pid": pid, "start": start_time(pid), "since": time.time()}


def _holder(url: str) -> dict[str, Any] | None:
    """The lock's record (None: no lock; an unreadable one is returned as ``{}``)."""
    fs, path = filesystem(url)
    if not fs.exists(path):
        return None
    try:
        record = json.loads(read_bytes(url, OSError))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _stale(record: dict[str, Any]) -> bool:
    pid = record.get("pid")
    if record.get("host") != host_identity() or isinstance(pid, bool) or not isinstance(pid, int):
        return False
    return pid != os.getpid() and not is_running(pid, record.get("start"))


def _create(url: str, record: dict[str, Any]) -> bool:
    """Create the lock file with ``record``; False when it exists already."""
    fs, path = filesystem(url)
    data = json.dumps(record).encode()
    if isinstance(fs, LocalFileSystem):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            return False
        except OSError as e:  # read-only storage, no permission: found now, not at the first checkpoint
            raise ConfigError(
                f"cannot write in the checkpoint directory: {url!r}: {e}; choose a writable checkpoint_directory"
            ) from e
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    if fs.exists(path):
        return False
    atomic_write_bytes(url, data, ConfigError)
    return True


def acquire_run_lock(directory: str, run_id: str) -> RunLock:
    """Take run ``run_id``'s lock (creating the run's directory, private to this user, if needed).

    Raises:
        ConfigError: another live fit holds it (the message names it and, when it cannot be checked from here, the
            file to delete), or the run's directory cannot be created.
    """
    run = join(directory, run_id)
    make_dirs(run, ConfigError, "checkpoint run directory")
    url = join(run, LOCK_FILE)
    record = _record()
    for _ in range(2):  # a second try after removing a stale lock
        if _create(url, record):
            return RunLock(url, record)
        holder = _holder(url)
        if holder is None:
            continue  # released in between
        if _stale(holder):
            log.warning(
                "run %r: taking over the lock of pid %s, which no longer runs (%s)", run_id, holder.get("pid"), url
            )
            fs, path = filesystem(url)
            with contextlib.suppress(FileNotFoundError):
                fs.rm(path)
            continue
        break
    who = (
        f"pid {holder.get('pid')} on {holder.get('host')} since "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(holder['since']))}"
        if holder and isinstance(holder.get("since"), (int, float))
        else "a fit whose lock record is unreadable"
    )
    raise ConfigError(
        f"run {run_id!r} is being trained by another fit ({who}): two fits of one run would "
        f"interleave their checkpoints. Wait for it to end, or use another run_id; if that fit is gone "
        f"(another host, or a damaged record), delete {url!r}"
    )
