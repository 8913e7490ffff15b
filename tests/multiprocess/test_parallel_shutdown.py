"""A failing worker or Ctrl-C stops every worker, re-raises the real cause, and leaves no process behind."""

from __future__ import annotations

import _thread
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _faulty import FailingForward

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.errors import WorkerError
from torchspark.parallel import LocalProcessRunner, ParallelWrapper
from torchspark.parallel.supervision import Supervisor
from torchspark.training.config.masters import ParameterAveragingTrainingMaster


@pytest.fixture
def runner() -> LocalProcessRunner:
    """The runner the wrapper under test uses (injected), so a test can look at its worker processes afterwards."""
    return LocalProcessRunner(["cpu", "cpu"], threads_per_worker=1)


def _spawned_children() -> list[int]:
    """Pids of live (or unreaped) processes whose parent is this process and that multiprocessing spawned."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is still a process that is not a zombie (workers may be children of the fork server)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _assert_no_workers_left(runner: LocalProcessRunner) -> None:
    assert len(runner.children) == 2
    for proc in runner.children:
        assert not proc.is_alive() and proc.exitcode is not None, proc
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("torchspark-worker")]
    if Path("/proc/self/stat").exists():
        assert _spawned_children() == []
        pids = [proc.pid for proc in runner.children]
        deadline = time.monotonic() + 10.0  # the fork server reaps its children asynchronously
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _running(pid)], "a worker process is still running"


def test_nan_in_a_later_minibatch_names_the_nan_not_a_peer_error(runner) -> None:
    data = datasets.synthetic_classification(96, 12, 3, seed=1)
    x = data.features.clone()
    x[3 * 8 + 2, 5] = float("nan")  # minibatch 3 (worker 0's 4th): the first one passes the driver's check
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1), seed=0)
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=2, progress=False, runner=runner
    )
    before = net.params().clone()

    with pytest.raises(WorkerError) as info:
        wrapper.fit(DataSet(x, data.labels), epochs=1, batch_size=8)

    message = str(info.value)
    assert message.startswith("worker 0 failed: torchspark.errors.TrainingError: loss is nan at iteration 3")
    assert "NaN" in message and "--- worker traceback ---" in message
    assert "Connection" not in message.splitlines()[0]
    torch.testing.assert_close(net.params(), before)  # a failed fit leaves the driver's network alone
    _assert_no_workers_left(runner)


def test_user_exception_in_one_worker_is_reported_with_its_traceback(runner) -> None:
    data = datasets.synthetic_classification(96, 12, 3, seed=1)
    net = Network(FailingForward(12, 3, after=4, rank=1), updater=optim.SGD(lr=0.1), seed=0)
    wrapper = ParallelWrapper(net, num_workers=2, training_mode="sharing", progress=False, runner=runner)

    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=1, batch_size=8)

    message = str(info.value)
    assert message.startswith("worker 1 failed: _faulty.InjectedFailure: injected failure in forward call 5"), message
    assert "_faulty.py" in message  # the worker's own traceback, down to the user's line
    _assert_no_workers_left(runner)


def test_ctrl_c_in_the_parent_stops_all_workers_and_propagates(runner) -> None:
    data = datasets.synthetic_classification(8000, 12, 3, seed=1)  # far more work than the test waits for
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.01), seed=0)
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=1, progress=False, runner=runner
    )
    interrupted_at: list[float] = []
    lock = threading.Lock()

    def press_ctrl_c(update) -> None:  # a progress listener: runs on a background thread while workers train
        with lock:
            if not interrupted_at:
                interrupted_at.append(time.monotonic())
                _thread.interrupt_main()  # what SIGINT from the terminal does to the main thread

    wrapper.add_progress_listener(press_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        wrapper.fit(data, epochs=5, batch_size=2)

    assert interrupted_at, "training ended before the interrupt"
    assert time.monotonic() - interrupted_at[0] < 15, "shutdown after Ctrl-C took too long"
    assert net.epoch == 0
    _assert_no_workers_left(runner)


def test_a_killed_worker_is_named_not_its_peers_connection_error(runner) -> None:
    data = datasets.synthetic_classification(8000, 12, 3, seed=1)
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.01), seed=0)
    master = ParameterAveragingTrainingMaster(averaging_frequency=1, max_failures=0)  # no recovery: the error
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False, runner=runner)
    killed: list[int] = []
    lock = threading.Lock()

    def kill_worker_1(update) -> None:  # the OOM killer, or a native crash, from the outside
        with lock:
            if not killed:
                killed.append(runner.children[1].pid)
                os.kill(killed[0], signal.SIGKILL)

    wrapper.add_progress_listener(kill_worker_1)
    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=5, batch_size=2)

    first = str(info.value).splitlines()[0]
    assert first.startswith("attempt 0: worker 1 on executor torchspark-worker-1 (pid "), first
    assert "signal SIGKILL" in first and "worker process torchspark-worker-1" in str(info.value)
    assert "max_failures=0" in str(info.value)
    _assert_no_workers_left(runner)


def test_the_root_cause_wins_over_a_peer_error_that_arrives_first() -> None:
    peer = "Traceback (most recent call last):\nRuntimeError: [gloo/transport/tcp/pair.cc] Connection closed by peer"
    cause = 'Traceback (most recent call last):\n  File "model.py", line 3\nValueError: bad input in layer 2'
    later: queue.Queue = queue.Queue()
    later.put(("error", 1, cause))
    supervisor = Supervisor(timeout_s=300.0)
    with pytest.raises(WorkerError) as info:
        supervisor.raise_worker_error(later, [(0, peer)], wait_s=5.0)
    assert str(info.value).startswith("worker 1 failed: ValueError: bad input in layer 2")
    assert 'File "model.py", line 3' in str(info.value)


@pytest.mark.timeout(300)
def test_sigterm_of_a_driver_mid_fit_leaves_no_pymp_directory_and_no_worker(tmp_path: Path) -> None:
    """SIGTERM of the driver mid-fit shuts the workers down and lets multiprocessing remove its ``pymp-*``
    directory (the fork server's socket), as a Ctrl-C does: nothing is left in the temp directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    driver = Path(__file__).with_name("_sigterm_driver.py")
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(driver)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _worker_pids(proc.pid) and proc.poll() is None:  # the workers are training
            assert time.monotonic() < deadline, "the driver's workers did not start"
            time.sleep(0.1)
        assert list(tmp.glob("pymp-*")), "multiprocessing made no pymp-* directory: nothing to check"
        workers = _worker_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode()[-2000:]
    assert not list(tmp.glob("pymp-*")), sorted(p.name for p in tmp.iterdir())
    deadline = time.monotonic() + 10.0  # the fork server reaps its children asynchronously
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if _running(pid)], "a worker process outlived its driver"


def _worker_pids(driver: int) -> list[int]:
    """Pids of the worker processes of ``driver``: the children of its fork server (a child of the driver)."""

    def parent(pid: int | str) -> int:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])

    found = []
    for entry in Path("/proc").iterdir():
        try:
            server = Path("/proc") / str(parent(entry.name)) if entry.name.isdigit() else None
            if (
                server is not None
                and parent(server.name) == driver
                and b"forkserver" in (server / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found
