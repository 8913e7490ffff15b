"""Recovery's pieces without processes: the retry decision, max_failures, Spark's reason, the watchdog, and the
driver's attempt loop (with the in-process runner and a runner that loses its first attempts)."""

from __future__ import annotations

import datetime
import os

import pytest
import torch

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, DataError, WorkerError, WorkerLost
from torchspark.spark.barrier import relay_key
from torchspark.stats import StatsCollector
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, master_from_json
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.driver.fit import build_task, run_fit
from torchspark.training.driver.recovery import Decision, FailureRecord, decide
from torchspark.training.driver.runner import InProcessRunner
from torchspark.training.progress import ProgressClient
from torchspark.training.progress.liveness import Liveness
from torchspark.training.rendezvous.stores import fetch, listening_store, publish
from torchspark.training.worker.loop import ItemSource

# Spark 4's own text for a barrier task whose Python worker was killed (kill -9) on local[2], trimmed
KILLED_PYTHON = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed barrier \
ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(0, 1) finished unsuccessfully.
org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting 'x' to 'true'.
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse(PythonRunner.scala:1136)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: java.io.EOFException
\tat java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)
"""
# ... and for an executor JVM killed on local-cluster (the reason line as Spark writes it)
LOST_EXECUTOR = """org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 4.0 failed 1 \
times, most recent failure: Lost task 1.0 in stage 4.0 (TID 9) (10.0.0.5 executor 2): ExecutorLostFailure \
(executor 2 exited caused by one of the running tasks) Reason: Command exited with code 137
Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)
"""
# ... when Spark reports first the peer that saw the killed worker's connection drop (the Python traceback follows
# on the same line as Spark's words)
PEER_FIRST = """org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(9, 0) finished unsuccessfully.
org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):
  File "worker.py", line 1, in run
torchspark.errors.PeerLost: a peer worker left the shared-memory barrier ([Errno 32] Broken pipe)
	at org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)
"""
USER_ERROR = """org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed: \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "model.py", line 3, in forward
ValueError: bad input in layer 2
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)
"""


@pytest.mark.parametrize(
    "error, failures, max_failures, expected",
    [
        (WorkerLost("lost"), 1, 3, Decision.RETRY),
        (WorkerLost("lost"), 3, 3, Decision.RETRY),
        (WorkerLost("lost"), 4, 3, Decision.EXHAUSTED),
        (WorkerLost("lost"), 1, 0, Decision.EXHAUSTED),
        (WorkerError("worker 1 failed: ValueError"), 1, 3, Decision.RAISE),
        (DataError("bad label"), 1, 3, Decision.RAISE),
    ],
)
def test_only_lost_workers_are_retried_while_max_failures_allows(error, failures, max_failures, expected) -> None:
    assert decide(error, failures, max_failures) is expected


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
def test_max_failures_is_validated_and_round_trips(cls) -> None:
    assert cls().max_failures == 3
    assert master_from_json(cls(max_failures=0).to_json()).max_failures == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="max_failures must be an integer >= 0"):
            cls(max_failures=bad)


def test_sparks_reason_names_the_worker_and_what_happened() -> None:
    from torchspark.spark.jobs import lost_worker, spark_reason, task_error

    reason = spark_reason(KILLED_PYTHON)
    assert reason.startswith(
        "Stage failed because barrier task ResultTask(0, 1) finished unsuccessfully. "
        "Python worker exited unexpectedly (crashed)"
    )
    assert "Thread.run" not in reason and "EOFException" not in reason
    error = task_error(Exception(KILLED_PYTHON), "fit")
    assert isinstance(error, WorkerLost) and error.rank == 1
    assert str(error).startswith("fit: worker 1 was lost (crashed (the Python worker ended without an exit code")
    assert error.exit_status is not None and error.exit_status.startswith("crashed")  # not None: the record says so

    lost = lost_worker(Exception(LOST_EXECUTOR), "fit", None)
    assert lost is not None and lost.executor == "2" and lost.rank == 1
    assert lost.exit_status == "exit code 137 (signal SIGKILL)"
    assert "ExecutorLostFailure (executor 2 exited caused by one of the running tasks)" in lost.reason

    peer = task_error(Exception(PEER_FIRST), "fit")
    assert isinstance(peer, WorkerLost) and peer.rank is None  # rank 0 only saw it; the driver infers who was lost
    assert peer.reason.endswith(
        "worker 0 saw: torchspark.errors.PeerLost: a peer worker left the shared-memory "
        "barrier ([Errno 32] Broken pipe)"
    ), peer.reason
    assert "File " not in peer.reason

    user = task_error(Exception(USER_ERROR), "fit")
    assert not isinstance(user, WorkerLost)  # the user's code failed: not retried
    assert "ValueError: bad input in layer 2" in str(user) and "Spark's reason" in str(user)


#: what Spark said when a real-size fit (13.5 M parameters, Adam) ran on local[2] with the default 1g driver heap
JVM_OOM = (
    "An error occurred while calling o123.collectAndServe.\n: org.apache.spark.SparkException: Job aborted due to "
    "stage failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: Stage failed "
    "because barrier task ResultTask(5, 0) finished unsuccessfully.\njava.lang.OutOfMemoryError: Java heap space\n"
    "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n\tat java.base/java.lang.Thread.run(Thread.java:840)"
)


def test_a_jvm_out_of_memory_is_not_retried_and_names_the_setting_to_raise() -> None:
    from torchspark.errors import TrainingError
    from torchspark.spark.jobs import task_error

    error = task_error(Exception(JVM_OOM), "torchspark fit: 2 workers")
    assert isinstance(error, TrainingError) and not isinstance(error, WorkerLost)  # the retry would fail the same
    message = str(error)
    assert message.startswith(
        "torchspark fit: 2 workers: a Spark JVM ran out of memory (java.lang.OutOfMemoryError: Java heap space)"
    )
    assert "Raise spark.driver.memory" in message and "local_session(conf={'spark.driver.memory': '4g'})" in message
    assert "barrier task ResultTask(5, 0) finished unsuccessfully" in message  # Spark's reason, without Java frames
    assert "Arrays.copyOf" not in message
    # a Python MemoryError in the worker is the user's (or the data's): not this error
    python_oom = task_error(Exception(USER_ERROR.replace("ValueError: bad input in layer 2", "MemoryError")), "fit")
    assert not isinstance(python_oom, TrainingError) or "spark.driver.memory" not in str(python_oom)


def test_the_watchdog_names_a_silent_rank_and_a_stage_that_never_ends() -> None:
    now = [100.0]
    live = Liveness(clock=lambda: now[0])
    live.seen(0, pid=11)
    live.seen(1, pid=12)
    now[0] = 110.0
    live.seen(0)
    assert live.stalled(2, timeout_s=20) is None
    now[0] = 125.0  # rank 1 silent for 25 s
    lost = live.stalled(2, timeout_s=20)
    assert isinstance(lost, WorkerLost) and lost.rank == 1 and "pid 12" in str(lost)
    live.ended(0)
    live.ended(1)  # both finished: fine for now ...
    assert live.stalled(2, timeout_s=20) is None
    now[0] = 150.0  # ... but the cluster has not delivered their results 25 s later
    late = str(live.stalled(2, timeout_s=20))
    assert "an executor stopped responding" in late and "raise spark.driver.memory" in late


def test_the_rendezvous_key_is_named_by_the_attempt() -> None:
    token = b"t" * 32
    store = listening_store("127.0.0.1", 0, None, 5.0)
    publish(store, token, relay_key(0, 0), "stale-worker-0:1234")
    assert fetch(store, token, relay_key(0, 0)) == "stale-worker-0:1234"
    store.set_timeout(datetime.timedelta(seconds=0.5))
    with pytest.raises(Exception, match="(?i)timeout|timed out|wait"):  # attempt 1 never reads attempt 0's value
        fetch(store, token, relay_key(1, 0))
    assert len({relay_key(0, 0), relay_key(1, 0), relay_key(0, 1)}) == 3


class LosesFirstAttempts:
    """A runner that loses its first ``lost`` attempts (as a killed worker would), then trains in threads."""

    def __init__(self, lost: int, error: Exception | None = None) -> None:
        self.lost, self.error = lost, error
        self.tasks: list = []
        self.tokens: list[bytes] = []
        self.descriptions: list[str] = []

    def run(self, task, data, context):
        self.tasks.append(task)
        self.tokens.append(context.progress_address().token)
        self.descriptions.append(context.description)
        if len(self.tasks) <= self.lost:
            raise self.error or WorkerLost(
                f"worker 1 lost in attempt {context.attempt}", rank=1, exit_status="signal SIGKILL", reason="killed"
            )
        return InProcessRunner().run(task, data, context)


def _fit(runner, max_failures: int, listeners=()):
    data = datasets.synthetic_classification(64, 6, 3, seed=0)
    net = Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(averaging_frequency=2, collect_training_stats=True)
    recorder = StatsCollector("driver")
    task = build_task(net, master, 2, True, recorder)
    sources = [ItemSource(data.split(8)[r::2]) for r in range(2)]
    before = net.params().clone()
    outcome = run_fit(
        net,
        task,
        runner,
        sources,
        recorder=recorder,
        description="fit",
        progress=False,
        max_failures=max_failures,
        listeners=listeners,
    )
    return net, outcome, before


def test_a_lost_attempt_is_run_again_with_fresh_names_and_recorded(tmp_path) -> None:
    runner = LosesFirstAttempts(2)
    net, outcome, _ = _fit(runner, max_failures=2)
    reference, _, _ = _fit(LosesFirstAttempts(0), max_failures=0)

    assert [t.attempt for t in runner.tasks] == [0, 1, 2]
    assert len(set(runner.tokens)) == 3  # a new progress server and token per attempt: stale workers are refused
    assert runner.descriptions == ["fit", "fit (attempt 1)", "fit (attempt 2)"]
    torch.testing.assert_close(net.params(), reference.params())  # restarted from the fit's start state
    assert net.epoch == 2
    summary = outcome.stats.summary()
    assert [f["attempt"] for f in summary["failures"]] == [0, 1]
    assert summary["failures"][0]["rank"] == 1 and summary["failures"][0]["exit_status"] == "signal SIGKILL"
    assert summary["recovered_from"] == {"attempt": 2, "epoch": 0, "iteration": 0, "checkpoint": None}
    path = tmp_path / "stats.html"
    outcome.stats.export_html(str(path))
    html = path.read_text()
    assert html.count('class="failure"') == 2 and "lost: attempt 1" in html  # each failure on the timeline
    assert "the shaded work was lost and trained again" in html


def test_a_stale_token_is_refused_by_the_next_attempts_server() -> None:
    from torchspark.training.hooks import ProgressUpdate

    class Probe(LosesFirstAttempts):
        def run(self, task, data, context):
            endpoint = context.progress_address()
            if self.tokens:  # attempt 1: a worker left over from attempt 0 talks, and so does one of attempt 1
                for token, epoch in ((self.tokens[0], 99), (endpoint.token, 98)):
                    client = ProgressClient(endpoint.host, endpoint.port, 1, token=token).connect()
                    client.send(ProgressUpdate(1, epoch, 1, 1, 0.0))
                    client.close()
            return super().run(task, data, context)

    heard: list = []
    _fit(Probe(1), max_failures=1, listeners=[heard.append])
    epochs = {u.epoch for u in heard}
    assert 98 in epochs  # the current attempt's token is heard ...
    assert 99 not in epochs  # ... the failed attempt's is not


def test_exhausted_retries_raise_naming_every_failure_and_the_knob() -> None:
    with pytest.raises(WorkerLost) as info:
        _fit(LosesFirstAttempts(5), max_failures=1)
    message = str(info.value)
    assert "max_failures=1" in message and "2 time(s)" in message
    assert "attempt 0: worker 1" in message and "attempt 1: worker 1" in message


def test_the_users_error_is_raised_at_once() -> None:
    runner = LosesFirstAttempts(5, error=WorkerError("worker 0 failed: ValueError: bad input"))
    with pytest.raises(WorkerError, match="bad input"):
        _fit(runner, max_failures=3)
    assert len(runner.tasks) == 1


def test_a_rank_the_driver_infers_gets_an_exit_status_saying_what_is_known() -> None:
    from torchspark.training.driver.recovery import SILENT_END, record_failure

    inferred = record_failure(WorkerLost("a peer saw it", reason="peer"), 0, 0.0, None, {1: 4242}, suspect=1)
    assert (inferred.rank, inferred.pid, inferred.exit_status) == (1, 4242, SILENT_END)
    named = record_failure(WorkerLost("lost", rank=1, exit_status="signal SIGKILL"), 0, 0.0, None, suspect=0)
    assert (named.rank, named.exit_status) == (1, "signal SIGKILL")  # what the error knows wins
    unknown = record_failure(WorkerLost("lost", reason="?"), 0, 0.0, None)
    assert unknown.exit_status is None  # no rank, no suspect: nothing is claimed


def _failure(attempt: int, point: tuple[int, int] | None, status: str | None, reason: str) -> FailureRecord:
    epoch, iteration = point if point is not None else (None, None)
    return FailureRecord(attempt, 1, None, status, reason, 0.0, 0.0, epoch, iteration)


def test_two_timeouts_at_the_same_step_are_a_hang_and_end_the_retries() -> None:
    from torchspark.training.driver.recovery import hang_error, repeated_hang

    wait = "worker 0 saw: torchspark.errors.WaitTimeout: the averaging allreduce timed out waiting for a peer"
    hang = [_failure(0, (0, 4), None, wait), _failure(1, (0, 4), "no heartbeat", "no heartbeat from worker 1")]
    assert repeated_hang(hang)
    error = hang_error(hang, WorkerLost("lost"))
    assert not isinstance(error, WorkerLost)  # not retried, not "lost"
    assert str(error).startswith("attempts 0 and 1 both stopped at epoch 0, minibatch 4 (the furthest progress")
    assert "raise rendezvous_timeout_s" in str(error)
    assert not repeated_hang(hang[:1])  # one hang may be a frozen machine: retried
    assert not repeated_hang([hang[0], _failure(1, (1, 2), None, wait)])  # a different step: a machine, retried
    killed = [_failure(0, (0, 4), "signal SIGKILL", "killed"), _failure(1, (0, 4), "signal SIGKILL", "killed")]
    assert not repeated_hang(killed)  # processes that died are lost machines (elastic recovery shrinks on them)
    peer = "worker 0 saw: torchspark.errors.PeerLost: a peer worker left (timed out waiting)"
    assert not repeated_hang([_failure(0, (0, 4), None, peer), _failure(1, (0, 4), None, peer)])
    assert not repeated_hang([_failure(0, None, "no heartbeat", "x"), _failure(1, None, "no heartbeat", "x")])


def test_a_killed_jvms_exit_code_is_read_even_before_it_has_finished_exiting(monkeypatch) -> None:
    import signal
    import subprocess
    import sys

    from torchspark.spark import jobs

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    killed, alive = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        assert jobs._exit_code(killed) == -signal.SIGKILL  # waited for: poll() alone may still say "running"
        monkeypatch.setattr(jobs, "JVM_EXIT_WAIT_S", 0.2)
        assert jobs._exit_code(alive) is None  # still running after the wait: unknown, not a made-up code
    finally:
        alive.kill()
        alive.wait()
