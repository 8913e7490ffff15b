"""The background lane: the suite's long child runs start when the session starts and overlap the other tests.

A child run (the Spark Connect tier's own pytest, a local-cluster script, mypy) mostly waits: for JVMs to start, for
executors, for peers' timeouts. Run where its test stands it leaves a core idle that long. ``tests/conftest.py``
starts the child runs the selected tests need on one background thread, one after the other (never two
local-clusters at once), as the session starts, and moves their tests to the end of the run; a test then takes its
run's finished result with :meth:`BackgroundLane.result`. A run that was not started ahead (the lane is off under
pytest-xdist, or its test was not among the selected ones when the lane started) runs in the asking test itself.

Every run is a plain child process (stdout and stderr captured, in its own process group so that closing the lane
ends the JVMs it started too) with its own timeout; :class:`ChildRun` is one row of ``CHILD_RUNS``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CHILD_RUNS", "BackgroundLane", "ChildResult", "ChildRun"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SCRIPTS = TESTS / "spark" / "scripts"


@dataclass(frozen=True)
class ChildRun:
    """One child process of the suite: its arguments after ``python``, the environment changes, its timeout."""

    args: tuple[str, ...]
    timeout_s: float
    set_env: dict[str, str] = field(default_factory=dict)
    drop_env: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if k not in self.drop_env}, **self.set_env}


@dataclass(frozen=True)
class ChildResult:
    """A finished child run: exit status, output, and what ``snapshot`` returned just before the child started
    (``tests/conftest.py`` passes a :class:`Leftovers` snapshot, so leftovers are judged against the moment the
    child started, not the moment its test ran)."""

    returncode: int
    stdout: str
    stderr: str
    before: Any = None


def _script(name: str, *args: str, drop_env: tuple[str, ...] = ()) -> ChildRun:
    """A script of ``tests/spark/scripts`` whose executors run this interpreter."""
    return ChildRun((str(SCRIPTS / name), *args), 900, {"PYSPARK_PYTHON": sys.executable}, drop_env)


#: the child runs by name, each used by the tests that request the fixture ``tests/conftest.py`` maps to it
CHILD_RUNS: dict[str, ChildRun] = {
    # the Connect tier: a Connect client switches pyspark into a process-wide mode, so it needs its own process
    "connect-tier": ChildRun(
        ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "-n", "0", str(TESTS / "connect")),
        timeout_s=3000,
        set_env={"TORCHSPARK_CONNECT_TESTS": "1"},
        drop_env=("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"),
    ),
    "mypy": ChildRun(("-m", "mypy"), timeout_s=840),
    # the scripts below check settings of a Spark process of their own (not the shared session's)
    "session-settings": ChildRun(
        (str(SCRIPTS / "session_settings.py"),), 600, drop_env=("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    ),
    "worker-thread-settings": ChildRun((str(SCRIPTS / "worker_thread_settings.py"), "torch", "spark"), 600),
    # the local-cluster scripts (tests/spark/scripts): one session each for all the checks of their tests
    "gpu-scheduling": _script("gpu_cluster_fit.py", drop_env=("TORCHSPARK_GPU_DRY_RUN",)),  # the script sets it
    "local-cluster": _script("local_cluster_fit.py"),
    "recovery-cluster": _script("recovery_cluster_fit.py", "kill", "stop"),
    "elastic-cluster": _script("elastic_cluster_fit.py"),
}


def run_child(run: ChildRun, started: Callable[[subprocess.Popen], None] = lambda _: None) -> ChildResult:
    """Run ``run`` to the end (killing its process group at its timeout); ``started`` gets the process first."""
    proc = subprocess.Popen(
        [sys.executable, *run.args],
        cwd=ROOT,
        env=run.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVMs it starts end with it (see _end)
    )
    started(proc)
    try:
        out, err = proc.communicate(timeout=run.timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc)
        out, err = proc.communicate(timeout=30)
        err += f"\n[background lane] {' '.join(run.args)} ran past its {run.timeout_s:.0f} s timeout and was killed"
        return ChildResult(-signal.SIGKILL, out, err)
    return ChildResult(proc.returncode, out, err)


def _end(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group (the child and whatever it started, JVMs included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class BackgroundLane:
    """Runs named child runs one after the other on a daemon thread; :meth:`result` waits for one.

    ``snapshot`` is called just before each child starts; its value travels in :attr:`ChildResult.before`.
    ``runs``: the runs by name (default :data:`CHILD_RUNS`).
    """

    def __init__(self, snapshot: Callable[[], Any] = lambda: None, runs: dict[str, ChildRun] | None = None) -> None:
        self._snapshot = snapshot
        self._runs = CHILD_RUNS if runs is None else runs
        self._queued: list[str] = []
        self._results: dict[str, ChildResult | BaseException] = {}
        self._done: dict[str, threading.Event] = {}
        self._running: subprocess.Popen | None = None
        self._closed = threading.Event()
        self._child_started = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def queued(self) -> list[str]:
        """The names started ahead, in their order."""
        return list(self._queued)

    def start(self, names: list[str]) -> None:
        """Start ``names`` (keys of the lane's runs) in this order on the lane's thread."""
        self._queued = list(dict.fromkeys(names))
        self._done = {name: threading.Event() for name in self._queued}
        if self._queued:
            self._thread = threading.Thread(target=self._work, name="background-lane", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        for name in self._queued:
            if self._closed.is_set():
                self._results[name] = RuntimeError(f"background lane closed before {name!r} ran")
            else:
                self._results[name] = self._run(name)
            self._done[name].set()
        # the thread stays until close(): tests that compare the threads alive before and after their body must not
        # see it end in between (close() sets the event; the timeout only bounds each wait)
        while not self._closed.wait(timeout=60):
            pass

    def _run(self, name: str) -> ChildResult | BaseException:
        try:
            before = self._snapshot()
            done = run_child(self._runs[name], started=self._started)
            return ChildResult(done.returncode, done.stdout, done.stderr, before)
        except BaseException as error:  # handed to the test that asks for this run
            return error
        finally:
            self._running = None

    def _started(self, proc: subprocess.Popen) -> None:
        self._running = proc
        self._child_started.set()
        if self._closed.is_set():
            _end(proc)

    def wait_started(self, timeout_s: float) -> bool:
        """Whether the lane's first child has started (waiting up to ``timeout_s``)."""
        return self._child_started.wait(timeout=timeout_s)

    def result(self, name: str) -> ChildResult:
        """``name``'s finished run: waited for when the lane started it, else run here and now."""
        if name not in self._done:
            before = self._snapshot()
            done = run_child(self._runs[name])
            return ChildResult(done.returncode, done.stdout, done.stderr, before)
        # bounded: every run ahead of it in the lane and itself end by their own timeouts (their kill included)
        limit = sum(self._runs[n].timeout_s + 60 for n in self._queued[: self._queued.index(name) + 1])
        if not self._done[name].wait(timeout=limit):
            raise TimeoutError(f"the background run {name!r} did not finish in {limit:.0f} s")
        found = self._results[name]
        if isinstance(found, BaseException):
            raise found
        return found

    def close(self) -> None:
        """End the run in progress (its whole process group) and skip those not started; waits for the thread."""
        self._closed.set()
        running = self._running
        if running is not None:
            _end(running)
        if self._thread is not None:
            self._thread.join(timeout=60)
