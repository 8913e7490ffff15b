"""Shared fixtures: one real local Spark session for the whole run (a session takes seconds to start)."""

from __future__ import annotations

import os
import sys

import pytest

import jvm_archive
import split_run
from background import BackgroundLane, ChildResult

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

#: the suite's JVMs: C1 only and a shared class-data archive (``tests/jvm_archive.py`` says why and what it saves)
os.environ.setdefault("SPARK_SUBMIT_OPTS", jvm_archive.driver_options())
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", f"{jvm_archive.C1_ONLY} {jvm_archive.QUIET_CDS}")

#: every test under these folders carries the folder's marker (``-m "not spark"`` deselects a whole tier)
FOLDER_MARKERS = {"spark": "spark", "multiprocess": "multiprocess", "multihost": "multihost", "connect": "connect"}
_TESTS = os.path.dirname(os.path.abspath(__file__))

#: tests/connect runs in its own pytest process (tests/spark/test_connect_tier.py starts it with this variable set):
#: a Spark Connect client changes pyspark's process-wide mode (``SPARK_CONNECT_MODE_ENABLED``), so it cannot share
#: a process with the classic ``spark`` fixture. ``TORCHSPARK_CONNECT_TESTS=1 pytest tests/connect`` runs it alone.
CONNECT_TIER_ENV = "TORCHSPARK_CONNECT_TESTS"
collect_ignore = [] if os.environ.get(CONNECT_TIER_ENV) == "1" else ["connect"]


#: the session's long child runs (``tests/background.py``): the fixture that hands out each run's result -> the run.
#: The lane starts the runs the selected tests need when the session starts, in the order their tests come (this
#: order); in one process those tests' modules move to the end of the run, so the runs overlap all the rest.
BACKGROUND_OF_FIXTURE = {
    "connect_tier_run": "connect-tier",
    "gpu_runs": "gpu-scheduling",
    "local_cluster_runs": "local-cluster",
    "recovery_cluster_runs": "recovery-cluster",
    "elastic_run": "elastic-cluster",
    "session_settings_run": "session-settings",
    "thread_settings_run": "worker-thread-settings",
    "mypy_run": "mypy",
}

#: pytest-xdist groups (``--dist loadgroup``: a group runs on one worker, in collection order). The tests that mostly
#: wait (child processes, JVMs starting, peers' timeouts) form one group, ``side``, started first: one worker runs
#: it, and with it the background lane, while the other workers take the in-process groups. Every local-cluster and
#: the namespace cluster are in it, so two of them never run at the same time. Side: the tests using one of these
#: session fixtures (and those of ``BACKGROUND_OF_FIXTURE``) and these modules.
SIDE = "side"
SIDE_FIXTURES = ("shipped_archive", "netns_cluster", *BACKGROUND_OF_FIXTURE)
SIDE_MODULES = {
    "spark/test_recovery_cluster.py",  # a module fixture of the whole module
    "spark/test_gpu_scheduling.py",
    "spark/test_driver_jvm.py",  # a session in a child process whose JVM is killed
    "spark/test_session_settings.py",
    "spark/test_shipping.py",
    "spark/test_private_exports_spark.py",  # drivers in child processes, killed
    "spark/test_cli_spark.py",  # the command in child processes
    "spark/test_preflight.py",  # sessions in a child process
    "multiprocess/test_parallel_resume.py",  # driver processes
    "packaging/test_package.py",  # a build, a fresh venv, a fit from the wheel
    "unit/test_lint.py",  # mypy
}


def _background_runs(item) -> list[str]:
    return [run for fixture, run in BACKGROUND_OF_FIXTURE.items() if fixture in getattr(item, "fixturenames", ())]


def _xdist_group(item) -> str:
    """The pytest-xdist group of a test: :data:`SIDE` for the waiting tests, else its module (its path under
    tests/), so module-scoped fixtures (one fit shared by a module's tests) also run once."""
    module = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
    if module.startswith("connect/"):
        return "connect"  # run alone (TORCHSPARK_CONNECT_TESTS=1): one group, so one Connect server
    if module in SIDE_MODULES or module.startswith("multihost/"):
        return SIDE
    if any(fixture in getattr(item, "fixturenames", ()) for fixture in SIDE_FIXTURES):
        return SIDE
    return module


def _group(item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        folder = os.path.relpath(str(item.path), _TESTS).split(os.sep)[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, FOLDER_MARKERS[folder]))
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    # collection order, except: the modules waiting for a background run go last (the lane has the whole run to
    # finish their runs), under pytest-xdist the side group goes first (its worker starts the lane at once), and in
    # a split run the tests of the child's tiers come after the others, whose time the child runs beside
    distributed = config.getoption("dist", "no") != "no"
    late = {item.path for item in items if _background_runs(item)}
    proxied = {item.nodeid for item in split_run.plan_split(config, items)}

    def order(item) -> tuple[bool, bool, bool]:
        return distributed and _group(item) != SIDE, item.path in late, item.nodeid in proxied

    items.sort(key=order)  # stable
    if proxied:
        config.stash[SPLIT_CHILD] = split_run.SplitChild([item for item in items if item.nodeid in proxied])


@pytest.fixture(scope="session")
def spark():
    from torchspark.spark import local_session

    session = local_session(cores=2, app_name="torchspark-tests", rendezvous_timeout_s=120)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


#: the first test this process runs (``pytest_runtest_protocol``): under pytest-xdist it tells a worker its group
FIRST_TEST = pytest.StashKey[pytest.Item]()


#: what :func:`jvm_archive.ensure_archive` did this run (printed at the end)
ARCHIVE_NOTE = pytest.StashKey[str]()

#: the child process of a split run (``tests/split_run.py``)
SPLIT_CHILD = pytest.StashKey[split_run.SplitChild]()


def pytest_collection_finish(session) -> None:
    """Write the JVMs' class-data archive before the first test that starts a JVM (none for tests/unit alone),
    then start the child of a split run (which finds the archive written)."""
    unit = os.path.join(_TESTS, "unit")
    if any(not str(item.path).startswith(unit) for item in session.items):
        session.config.stash[ARCHIVE_NOTE] = jvm_archive.ensure_archive()
    child = session.config.stash.get(SPLIT_CHILD, None)
    if child is not None:
        child.start()


def pytest_terminal_summary(terminalreporter) -> None:
    note = terminalreporter.config.stash.get(ARCHIVE_NOTE, None)
    if note is not None:
        terminalreporter.write_line(f"JVM class-data archive: {note}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> bool | None:
    item.config.stash.setdefault(FIRST_TEST, item)
    child = item.config.stash.get(SPLIT_CHILD, None)
    if child is not None and item.nodeid in child.ids:
        split_run.replay(item, child)
        return True
    return None


def pytest_sessionfinish(session) -> None:
    child = session.config.stash.get(SPLIT_CHILD, None)
    if child is not None:
        child.close()


@pytest.fixture(scope="session", autouse=True)
def background_lane(request):
    """The background lane (``tests/background.py``), started with the runs the selected tests need. Under
    pytest-xdist only the worker that starts with the :data:`SIDE` group starts it, for that group's runs; in any
    other worker a run runs in its first test."""
    items = request.session.items
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = request.config.stash.get(FIRST_TEST, None)
        side = first is not None and _group(first) == SIDE
        items = [item for item in items if _group(item) == SIDE] if side else []
    child = request.config.stash.get(SPLIT_CHILD, None)
    if child is not None:  # the child's own lane starts what its tests need
        items = [item for item in items if item.nodeid not in child.ids]
    runs = {run for item in items for run in _background_runs(item)}
    lane = BackgroundLane(snapshot=Leftovers)
    lane.start([run for run in BACKGROUND_OF_FIXTURE.values() if run in runs])
    yield lane
    lane.close()


@pytest.fixture(scope="session")
def connect_tier_run(background_lane) -> ChildResult:
    """The Spark Connect tier (tests/connect) run in its own pytest process (``tests/spark/test_connect_tier.py``)."""
    return background_lane.result("connect-tier")


@pytest.fixture(scope="session")
def mypy_run(background_lane) -> ChildResult:
    """mypy over ``src/`` (``tests/unit/test_lint.py``)."""
    return background_lane.result("mypy")


@pytest.fixture(scope="session")
def session_settings_run(background_lane) -> ChildResult:
    """``scripts/session_settings.py`` (``tests/spark/test_session_settings.py``)."""
    return background_lane.result("session-settings")


@pytest.fixture(scope="session")
def thread_settings_run(background_lane) -> ChildResult:
    """``scripts/worker_thread_settings.py torch spark`` (``tests/spark/test_worker_thread_settings_spark.py``)."""
    return background_lane.result("worker-thread-settings")


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
