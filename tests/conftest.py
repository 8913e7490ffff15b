"""Shared fixtures: one real local Spark session for the whole run (a session takes seconds to start)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

#: every test under these folders carries the folder's marker (``-m "not spark"`` deselects a whole tier)
FOLDER_MARKERS = {"spark": "spark", "multiprocess": "multiprocess", "multihost": "multihost", "connect": "connect"}
_TESTS = os.path.dirname(os.path.abspath(__file__))

#: tests/connect runs in its own pytest process (tests/spark/test_connect_tier.py starts it with this variable set):
#: a Spark Connect client changes pyspark's process-wide mode (``SPARK_CONNECT_MODE_ENABLED``), so it cannot share
#: a process with the classic ``spark`` fixture. ``TORCHSPARK_CONNECT_TESTS=1 pytest tests/connect`` runs it alone.
CONNECT_TIER_ENV = "TORCHSPARK_CONNECT_TESTS"
collect_ignore = [] if os.environ.get(CONNECT_TIER_ENV) == "1" else ["connect"]


#: pytest-xdist groups (``--dist loadgroup`` in pyproject's addopts: a group runs on one worker). Tests that use one
#: of these session fixtures share that fixture's group, so what it starts starts once per run, not once per worker.
#: Every local-cluster tier (separate executor JVMs, seconds-long timeouts) is one group: those never run at the same
#: time as each other, only beside in-process tests.
GROUP_OF_FIXTURE = {
    "local_cluster_runs": "local-cluster",
    "shipped_archive": "local-cluster",
    "netns_cluster": "netns-cluster",
}
GROUP_OF_MODULE = {
    "spark/test_recovery_cluster.py": "local-cluster",
    "spark/test_elastic_cluster.py": "local-cluster",
    "spark/test_gpu_scheduling.py": "local-cluster",
}

#: the groups that take longest (measured with ``--durations=0``), started first under ``--dist`` so that no worker
#: is left with a long one at the end while the other idles; every other group follows in collection order
SLOW_FIRST = ("spark/test_connect_tier.py", "local-cluster", "netns-cluster")


def _xdist_group(item) -> str:
    """The pytest-xdist group of a test: the group of the shared session fixture it uses, else of its module (its
    path under tests/ unless :data:`GROUP_OF_MODULE` names one), so module-scoped fixtures (one fit shared by a
    module's tests) also run once."""
    for fixture, group in GROUP_OF_FIXTURE.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    module = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
    return GROUP_OF_MODULE.get(module, module)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        folder = os.path.relpath(str(item.path), _TESTS).split(os.sep)[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, FOLDER_MARKERS[folder]))
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    if config.getoption("dist", "no") == "no":
        return  # one process: collection order
    rank = {group: i for i, group in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.get_closest_marker("xdist_group").args[0], len(rank)))  # stable


@pytest.fixture(scope="session")
def spark():
    from torchspark.spark import local_session

    session = local_session(cores=2, app_name="torchspark-tests", rendezvous_timeout_s=120)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


class Leftovers:
    """What a fit left behind: processes, ``/dev/shm`` segments and FIFOs, temp files.

    Segments, FIFOs and the files workers create carry the creating process's id in their names
    (``torchspark-<pid>-...``, ``torchspark-fifo-<pid>-...``); other fits on the machine make their own, so only
    names holding one of the fit's worker pids count (the pids workers report over the progress channel).
    """

    def __init__(self) -> None:
        import tempfile

        self.shm_dir = "/dev/shm"
        self.tmp_dir = tempfile.gettempdir()
        self.before = self._entries()

    def _entries(self) -> set[str]:
        found = set()
        for directory in (self.shm_dir, self.tmp_dir):
            if os.path.isdir(directory):
                found |= {os.path.join(directory, name) for name in os.listdir(directory)}
        return found

    @staticmethod
    def running(pid: int) -> bool:
        """Whether ``pid`` is a live process that is not a zombie (stopped processes count as running)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def assert_clean(self, gone: set[int] | list[int], pids: set[int] | list[int] = (), wait_s: float = 30.0) -> None:
        """Every pid in ``gone`` has ended (waiting up to ``wait_s``: a killed executor's workers end when their
        collectives time out); no process in ``pids`` is stopped; no new segment, FIFO or temp file names any of
        ``gone | pids``."""
        import time

        deadline = time.monotonic() + wait_s
        while any(self.running(p) for p in gone) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in gone if self.running(p)], f"processes left running: {sorted(gone)}"
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            assert state not in ("T", "t"), f"process {pid} left stopped"
        marks = [f"-{p}-" for p in {*gone, *pids}]
        new = sorted(e for e in self._entries() - self.before if any(m in os.path.basename(e) for m in marks))
        assert not new, f"left behind: {new}"


@pytest.fixture
def leftovers() -> Leftovers:
    return Leftovers()


@pytest.fixture(scope="module")
def module_leftovers() -> Leftovers:
    """:class:`Leftovers` for a module whose fits run once in a module fixture: that fixture requests this one, so
    the snapshot is taken before those fits."""
    return Leftovers()
