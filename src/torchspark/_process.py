"""Is the process that left something behind still running? Pid, start time and pid namespace, nothing else.

A crashed writer leaves files that only it could finish (temporary names of atomic writes, default export
directories); removing them is safe once its process is gone. A pid alone is not enough: pids are reused (the start
time tells the owner from a newcomer) and a container with its own pid namespace sees other pids (the namespace id,
in `host_identity`, keeps each namespace to judging its own processes).
"""

from __future__ import annotations

import os
import socket

__all__ = ["start_time", "pid_namespace", "host_identity", "is_running"]


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux; None elsewhere or when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # field 22 of stat; fields[0] is field 3
    except (OSError, IndexError):
        return None


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]`` on Linux; ``""`` where there is none to read)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def host_identity() -> str:
    """Where a pid means this process table: the host name and the pid namespace."""
    return f"{socket.gethostname()}/{pid_namespace()}"


def is_running(pid: int, start: str | None) -> bool:
    """Whether ``pid`` (started at ``start``, when known) may still run here; True whenever it cannot be told.

    A pid that exists with another start time was reused: the owner is gone. A pid of another user's process
    (``PermissionError``) counts as running.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = start_time(pid)
    return not (start and now and start != now)
