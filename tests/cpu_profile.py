"""A pytest plugin that measures the CPU each test costs, JVMs and Python workers included (root, cgroup v1 cpuacct).

The suite is CPU-bound on a 2-core machine, and wall times hide where the CPU goes: a test that starts a JVM, a
Spark worker or a child process costs CPU in processes that ``time`` does not see (a JVM left to exit after pytest,
a Spark daemon's forked workers). A cgroup counts every process in it, alive or gone. Run the suite in one and read
the group's counter around each test::

    mkdir -p /sys/fs/cgroup/cpuacct/tsuite
    sh -c 'echo $$ > /sys/fs/cgroup/cpuacct/tsuite/cgroup.procs; exec env PYTHONPATH=tests \\
        .venv/bin/python -m pytest -p cpu_profile'

Each test's line (node id, wall seconds, CPU seconds: setup, call and teardown, with every process started while it
ran) goes to ``$CPU_PROFILE_OUT`` (default ``cpu_profile.jsonl``), as JSON. The background lane's child runs
(``tests/background.py``) run beside the tests, so each is moved into a group of its own as it starts
(``tsuite-<run>``) and its total is written at the end instead of being charged to whichever test was running.
Without the group (not root, no cgroup v1) the plugin says so and measures nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["GROUP", "cpu_seconds"]

ROOT = "/sys/fs/cgroup/cpuacct"
#: the cgroup the run is in (``$CPU_PROFILE_GROUP``, default ``tsuite``)
GROUP = os.environ.get("CPU_PROFILE_GROUP", os.path.join(ROOT, "tsuite"))
OUT = os.environ.get("CPU_PROFILE_OUT", "cpu_profile.jsonl")
#: a substring of a lane child's command line -> its run's name
LANE_RUNS = {
    "tests/connect": "connect-tier",
    "-p split_run": "split-child",  # tests/split_run.py's second pytest
    "-m mypy": "mypy",
    "session_settings": "session-settings",
    "worker_thread_settings": "worker-thread-settings",
    "gpu_cluster_fit": "gpu-scheduling",
    "local_cluster_fit": "local-cluster",
    "recovery_cluster_fit": "recovery-cluster",
    "elastic_cluster_fit": "elastic-cluster",
}


def cpu_seconds(group: str) -> float:
    """The CPU seconds every process of ``group`` used since the group's counter was last reset."""
    with open(os.path.join(group, "cpuacct.usage")) as f:
        return int(f.read()) / 1e9


def _write(record: dict[str, Any]) -> None:
    with open(OUT, "a") as f:
        f.write(json.dumps(record) + "\n")


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _move_lane_children(stop: threading.Event) -> None:
    """Move each lane child (a child of this process whose command names a lane run) into its own group."""
    me, moved = os.getpid(), set()
    while not stop.wait(0.1):
        for pid in [p for p in os.listdir("/proc") if p.isdigit() and p not in moved and _parent(p) == me]:
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    command = f.read().replace("\0", " ")
            except OSError:
                continue
            for needle, name in LANE_RUNS.items():
                if needle in command:
                    group = f"{GROUP}-{name}"
                    os.makedirs(group, exist_ok=True)
                    with open(os.path.join(group, "cpuacct.usage"), "w") as f:
                        f.write("0")
                    with open(os.path.join(group, "cgroup.procs"), "w") as f:
                        f.write(pid)
                    moved.add(pid)


_STOP = threading.Event()


def pytest_configure(config: pytest.Config) -> None:
    if not os.path.isfile(os.path.join(GROUP, "cpuacct.usage")):
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"cpu_profile: no cgroup {GROUP}"), stacklevel=2)
        return
    threading.Thread(target=_move_lane_children, args=(_STOP,), name="cpu-profile", daemon=True).start()
    _write({"start": time.time(), "cpu": cpu_seconds(GROUP)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    if not os.path.isfile(os.path.join(GROUP, "cpuacct.usage")):
        yield
        return
    cpu, wall = cpu_seconds(GROUP), time.time()
    yield
    _write({"id": item.nodeid, "wall": round(time.time() - wall, 3), "cpu": round(cpu_seconds(GROUP) - cpu, 3)})


def pytest_unconfigure(config: pytest.Config) -> None:
    _STOP.set()
    if os.path.isfile(os.path.join(GROUP, "cpuacct.usage")):
        lanes = {
            name: cpu_seconds(f"{GROUP}-{name}") for name in LANE_RUNS.values() if os.path.isdir(f"{GROUP}-{name}")
        }
        _write({"end": time.time(), "cpu": cpu_seconds(GROUP), "lane": lanes})
