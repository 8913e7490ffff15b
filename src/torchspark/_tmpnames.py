"""Temporary names of atomic writes, and the removal of those a crashed writer left behind.

Every atomic write (`torchspark._io.atomic_write_bytes`, `torchspark._atomic_dir.write_directory`)
goes to a hidden sibling of its target and is then renamed over it::

    .<name>.tmp-<where>-<pid>-<start>-<random>     e.g. .rank-0.safetensors.tmp-3fa2c1d09b-4121-88231-9c0e...

``<where>`` is a short hash of the host name and pid namespace, ``<pid>`` and ``<start>`` (the process's start time
in clock ticks, ``0`` where unknown) name the writing process. A write that is killed (SIGKILL, a lost executor, a
power cut) leaves that name behind. The next write of the same target removes such leftovers, but only those that
are clearly abandoned: written here (same host and pid namespace) by a process that no longer runs (or whose pid now
belongs to a process started later). Another host's, a live process's, and older unmarked temporary names
(``.<name>.tmp-<random>``, from versions before this) are left alone. Readers never take these names for data:
they are hidden, and checkpoints and models are found by their exact names.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import uuid
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from torchspark._process import host_identity, is_running, start_time

__all__ = ["TMP_MARK", "temp_name", "abandoned", "remove_abandoned"]

log = logging.getLogger(__name__)

#: what follows ``.<name>`` in every temporary name
TMP_MARK = ".tmp-"
_OWNED = re.compile(r"([0-9a-f]{10})-([0-9]+)-([0-9]+)-[0-9a-f]{16}")


def _where() -> str:
    return hashlib.sha256(host_identity().encode()).hexdigest()[:10]


def temp_name(name: str) -> str:
    """A fresh temporary name for writing ``name`` (a file or directory name, not a path)."""
    pid = os.getpid()
    return f".{name}{TMP_MARK}{_where()}-{pid}-{start_time(pid) or 0}-{uuid.uuid4().hex[:16]}"


def abandoned(entry: str, name: str) -> bool:
    """Whether ``entry`` (a name in the target's directory) is a temporary name for ``name`` that a process of this
    host and pid namespace left and that process no longer runs."""
    prefix = f".{name}{TMP_MARK}"
    if not entry.startswith(prefix):
        return False
    owned = _OWNED.fullmatch(entry[len(prefix) :])
    if owned is None or owned.group(1) != _where():
        return False
    pid, start = int(owned.group(2)), owned.group(3)
    return not is_running(pid, None if start == "0" else start)


def remove_abandoned(fs: Any, parent: str, name: str) -> list[str]:
    """Remove the abandoned temporary files and directories of ``name`` in ``parent`` (an fsspec filesystem and
    path); returns the removed paths. Never raises: a write must not fail because old debris could not go."""
    try:
        entries = fs.ls(parent, detail=False)
    except (OSError, ValueError):
        return []  # no directory yet, or unreadable: nothing of ours to clean
    local = isinstance(fs, LocalFileSystem)
    removed = []
    for entry in entries:
        entry = str(entry).rstrip("/")
        if not abandoned(posixpath.basename(entry), name):
            continue
        if local and os.path.islink(entry):
            continue  # we write real files and directories; a symlink at such a name is not ours to follow
        try:
            fs.rm(entry, recursive=True)
        except (OSError, ValueError) as e:
            log.debug("could not remove the abandoned temporary %s: %s", entry, e)
            continue
        log.info("removed %s, left by a write whose process is gone", entry)
        removed.append(entry)
    return removed
