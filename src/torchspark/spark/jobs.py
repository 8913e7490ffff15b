"""Running Spark jobs from the driver, and turning a failed task into our error: the one place for both.

Every job torchspark submits (counting, exporting, the training barrier stage, each averaging round, evaluation)
runs through `run_job`: on a helper thread under its own job group, so Ctrl-C (or an error) on the driver
cancels it, and a failed task becomes a torchspark error carrying the end of the executor's Python traceback
(`task_error`), or, when no Python code failed (the Python worker was killed, the executor was lost or
stopped responding) a [`WorkerLost`][torchspark.errors.WorkerLost] naming the worker, the executor, the exit code and
Spark's own reason (`spark_reason`), which the driver's recovery retries. A task that raised one of our
errors keeps its class: an executor ``DataError`` (a bad
feature shape, a non-DataSet RDD item, a label out of range found mid-training) is caught by ``except DataError``
whichever job found it. When it happened inside training it is also a
[`WorkerError`][torchspark.errors.WorkerError] (`worker_error_type`).
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from torchspark.errors import TorchSparkError, TrainingError, WorkerLost
from torchspark.training.driver.failures import (
    is_peer_failure,
    last_line,
    traceback_tail,
    wait_for_root_cause,
    worker_error_type,
)
from torchspark.training.task import WorkerResult
from torchspark.training.waiting import call_on_thread

__all__ = [
    "CRASHED",
    "jvm_gone",
    "jvm_died",
    "jvm_guard",
    "run_job",
    "run_in_job_group",
    "run_barrier_stage",
    "task_error",
    "worker_traceback",
    "spark_reason",
    "lost_worker",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_PY_TRACE = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\n\s*at org\.apache|\Z)", re.S)
_OUR_ERROR = re.compile(r"^torchspark\.errors\.(\w+): (.*)$")

#: how long a failed stage waits for the progress channel to bring the failing worker's own traceback
ROOT_CAUSE_WAIT_S = 3.0

# Spark's words for a task whose Python worker or executor went away (no Python code raised)
_LOST = re.compile(
    r"Python worker exited unexpectedly|ExecutorLostFailure|Executor heartbeat timed out|"
    r"exited caused by one of the running tasks|Command exited with code|worker lost|"
    r"Executor .* (?:lost|exited)|Remote RPC client disassociated|Connection reset by peer",
    re.I,
)
# a JVM (the driver's, which in local mode runs the executors too, or an executor's) out of memory
_JVM_OOM = re.compile(r"java\.lang\.OutOfMemoryError: ([^\n]*)")
_TASK_RANK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)|Lost task (\d+)\.\d+ in stage")
_EXECUTOR = re.compile(r"ExecutorLostFailure \(executor (\S+?)[ )]|\(\S+ executor (\S+?)\)")
_EXIT_CODE = re.compile(r"exit(?:ed)?(?: with)? code (-?\d+)", re.I)
_REASON_START = re.compile(r"(?:Job aborted due to stage failure|Most recent failure reason): ")
_JAVA_NOISE = re.compile(r"^\s*(?:at |\.\.\. \d+ more|Caused by: java\.io\.EOFException|Driver stacktrace)")


def spark_reason(error: BaseException | str, max_chars: int = 600) -> str:
    """Spark's own account of a failed job, without Java stack frames: e.g. ``Stage failed because barrier task
    ResultTask(0, 1) finished unsuccessfully. Python worker exited unexpectedly (crashed)`` or ``ExecutorLostFailure
    (executor 1 exited caused by one of the running tasks) Reason: Command exited with code 137``."""
    text = str(error)
    start = _REASON_START.search(text)
    lines = text[start.end() :].splitlines() if start else text.splitlines()
    kept: list[str] = []
    for line in lines:
        if "Traceback (most recent call last)" in line:  # the Python part is shown apart, from its end
            head = line.split("Traceback (most recent call last)", 1)[0].strip()
            if head:
                kept.append(head.replace("org.apache.spark.SparkException: ", ""))
            break
        if _JAVA_NOISE.match(line) or not line.strip():
            if kept and line.lstrip().startswith("at "):
                break  # the first stack frame ends the reason
            continue
        kept.append(line.strip().replace("org.apache.spark.SparkException: ", ""))
    reason = " ".join(kept).replace("Could not recover from a failed barrier ResultStage. ", "")
    reason = reason.replace("Most recent failure reason: ", "")
    return reason[:max_chars] + ("..." if len(reason) > max_chars else "")


#: a Python worker process that ended without a word: the daemon that forked it ignores SIGCHLD, so neither it nor
#: Spark ever learns the exit code or signal (SIGKILL, the OOM killer, a segfault all read the same)
CRASHED = "crashed (the Python worker ended without an exit code: Spark does not learn it)"


def _exit_status(reason: str) -> str | None:
    match = _EXIT_CODE.search(reason)
    if match is None:
        return CRASHED if "Python worker exited unexpectedly" in reason else None
    code = int(match.group(1))
    if code > 128:  # a shell's / Spark's way of saying "killed by signal code - 128"
        import signal

        try:
            return f"exit code {code} (signal {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def lost_worker(error: BaseException, description: str, tb: str | None) -> WorkerLost | None:
    """A [`WorkerLost`][torchspark.errors.WorkerLost] when Spark says the worker's process or executor went away (``tb`` is None: no
    Python traceback) or the only Python error is a peer's symptom (``tb``, a hung or lost peer); else None."""
    text = str(error)
    if tb is not None and not is_peer_failure(tb):
        return None
    reason = spark_reason(text)
    if tb is None and not _LOST.search(text):
        return None
    rank_match = _TASK_RANK.search(text)
    rank = next((int(g) for g in rank_match.groups() if g is not None), None) if rank_match else None
    if tb is not None:  # Spark names the peer that saw the loss, not the lost worker (the driver infers that one)
        reason = f"{reason} {'a worker' if rank is None else f'worker {rank}'} saw: {last_line(tb, '?')}"
        rank = None
    exec_match = _EXECUTOR.search(text)
    executor = next((g for g in exec_match.groups() if g is not None), None) if exec_match else None
    status = _exit_status(reason)
    who = "a worker" if rank is None else f"worker {rank}"
    where = f" on executor {executor}" if executor else ""
    peer = f"\n--- a peer's traceback (a symptom) ---\n{traceback_tail(tb, 8)}" if tb is not None else ""
    return WorkerLost(
        f"{description}: {who}{where} was lost{f' ({status})' if status else ''}: {reason}{peer}",
        rank=rank,
        executor=executor,
        exit_status=status,
        reason=reason,
    )


def worker_traceback(error: BaseException) -> str:
    """The Python traceback of a failed task, dug out of Spark's Java exception text."""
    found = _PY_TRACE.findall(str(error))
    tb = found[-1] if found else str(error)
    return "\n".join(ln for ln in tb.strip().splitlines() if ln.strip() and not ln.strip().startswith("SQLSTATE"))


def _pick_traceback(
    spark_tb: str, reported_errors: Callable[[], list[tuple[int, str]]] | None, wait_s: float = ROOT_CAUSE_WAIT_S
) -> str:
    """Spark's traceback unless it is a peer's symptom and a worker reported the cause over the progress channel."""
    if reported_errors is None or not is_peer_failure(spark_tb):
        return spark_tb
    found = wait_for_root_cause(reported_errors, wait_s)
    return found[1] if found is not None and not is_peer_failure(found[1]) else spark_tb


def _reported_cause(reported_errors: Callable[[], list[tuple[int, str]]] | None) -> str | None:
    """The first traceback a worker reported that is not a peer's symptom, read now (no wait), else None."""
    found = reported_errors() if reported_errors is not None else []
    return next((tb for _, tb in found if not is_peer_failure(tb)), None)


def task_error(
    error: BaseException, description: str, reported_errors: Callable[[], list[tuple[int, str]]] | None = None
) -> TorchSparkError:
    """Our error for a failed Spark task.

    Args:
        error: the Py4J/PySpark exception the action raised.
        description: the job's description (named in the message).
        reported_errors: the progress channel's ``(rank, traceback)`` list: Spark reports whichever task failed
            first, often a peer that merely saw the failing worker's connection drop; a worker's own report of the
            cause wins over such a symptom, and so does it when Spark's text carries no Python traceback at all (a
            Spark Connect client may get the error message cut short).
    Returns:
        `lost_worker`'s WorkerLost when the worker's process or executor was lost; the executor's own class
        when it raised one of ours (as a WorkerError as well); else a WorkerError.
    """
    oom = _JVM_OOM.search(str(error))
    if oom is not None:
        return jvm_out_of_memory(description, oom.group(1).strip(), error)
    has_python = bool(_PY_TRACE.findall(str(error)))
    if has_python:
        tb: str | None = _pick_traceback(worker_traceback(error), reported_errors)
    else:  # Spark's text lost the traceback (a client's cut error message): a worker's own report names the cause
        tb = None if _LOST.search(str(error)) else _reported_cause(reported_errors)
    lost = lost_worker(error, description, tb)
    if lost is not None:
        return lost
    if tb is None:
        tb = worker_traceback(error)
    root = last_line(tb, str(error))
    tail = traceback_tail(tb)
    cls = worker_error_type(tb)
    match = _OUR_ERROR.match(root)
    if match and cls.__name__ != "WorkerError":
        return cls(f"{match.group(2)}\n--- executor traceback ({description}) ---\n{tail}")
    return cls(
        f"{description} failed on an executor: {root}\n--- Spark's reason ---\n{spark_reason(error)}\n"
        f"--- executor traceback ---\n{tail}"
    )


def jvm_out_of_memory(description: str, what: str, error: BaseException) -> TrainingError:
    """The error of a stage during which a Spark JVM ran out of memory: not retried (the next attempt would carry
    the same results), and it says which setting to raise."""
    return TrainingError(
        f"{description}: a Spark JVM ran out of memory (java.lang.OutOfMemoryError: {what}) while the stage ran or "
        "returned its results. A fit brings rank 0's network back to the driver through Spark (its parameters and "
        "the updater's state: with Adam 12 bytes per parameter, 162 MB for 13.5 M parameters), and the JVMs hold "
        "that several times over on the way. Raise spark.driver.memory (its default is 1g; in local mode the "
        "driver's JVM runs the executors too): local_session(conf={'spark.driver.memory': '4g'}) or spark-submit "
        "--driver-memory 4g, set before the session starts (4g trains the zoo's 13.5 M-parameter vgg with Adam on "
        "local[2]); on a cluster raise spark.executor.memory as well.\n--- Spark's reason ---\n"
        f"{spark_reason(error)}"
    )


#: how often a running job's watchdog is asked whether the workers are still alive
WATCH_S = 0.5


def jvm_gone(sc: Any) -> str | None:
    """``None`` while the driver's JVM answers; else how it ended (``"exit code 137 (signal SIGKILL)"``, or
    ``"exit code unknown"`` when this process did not start it)."""
    try:
        sc._jsc.sc().isStopped()
        return None
    except Exception:  # noqa: BLE001 - any failure to reach the JVM (py4j, a refused or reset connection)
        proc = getattr(getattr(sc, "_gateway", None), "proc", None)
        code = _exit_code(proc) if proc is not None else None
        return (
            "exit code unknown" if code is None else _exit_status(f"exit code {abs(code) + (128 if code < 0 else 0)}")
        )


#: how long a JVM whose connection broke gets to finish exiting before its exit code is read
JVM_EXIT_WAIT_S = 5.0


def _exit_code(proc: Any) -> int | None:
    """The JVM process's exit code, waiting up to `JVM_EXIT_WAIT_S` for it: a killed process closes its
    sockets before it has finished exiting (a large heap takes a moment to unmap), so py4j can see the connection
    drop while ``poll()`` still says "running"; None when it really is still running."""
    try:
        return proc.wait(timeout=JVM_EXIT_WAIT_S)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: alive (py4j broke for another reason)
        return proc.poll()


def jvm_died(description: str, how: str) -> TrainingError:
    """The error of a fit whose Spark driver JVM died (``how``: from `jvm_gone`)."""
    return TrainingError(
        f"{description}: the Spark driver JVM died ({how}); this Spark session cannot run anything more. Start "
        "a new SparkSession (if the JVM ran out of memory, raise spark.driver.memory; its log says why it "
        "ended) and fit again, with the same run_id to resume from the newest checkpoint"
    )


@contextmanager
def jvm_guard(sc: Any, description: str) -> Iterator[None]:
    """Turn py4j's raw errors of a dead driver JVM (``ConnectionRefusedError``, ``Py4JNetworkError``) raised
    inside the block into `jvm_died`'s TrainingError; any other error passes unchanged."""
    from py4j.protocol import Py4JError

    try:
        yield
    except (Py4JError, ConnectionError) as e:
        how = jvm_gone(sc)
        if how is None:
            raise
        raise jvm_died(description, how) from e


def _cancel(sc: Any, group: str) -> None:
    """Cancel the job group, unless the JVM is gone (then there is nothing left to cancel)."""
    try:
        sc.cancelJobGroup(group)
    except Exception as e:  # noqa: BLE001 - a dead JVM refuses the connection; the caller reports that
        log.debug("could not cancel job group %s: %s", group, e)


def run_in_job_group(
    sc: Any,
    description: str,
    action: Callable[[], _T],
    thread_name: str = "torchspark-job",
    watchdog: Callable[[], BaseException | None] | None = None,
) -> _T:
    """Run ``action`` (which submits Spark jobs) on a helper thread under a fresh job group and return its value.

    Ctrl-C (or any exception) on the calling thread cancels the group and waits up to 60 s for the thread; an
    exception raised by ``action`` cancels the group and is re-raised unchanged on the calling thread.
    ``watchdog`` (polled every `WATCH_S` while the job runs) returns an error when the job will never
    finish well (a worker stopped responding): the group is cancelled and that error raised instead of Spark's.
    """
    group = f"torchspark-{uuid.uuid4().hex[:12]}"
    tripped: list[BaseException] = []
    stop = threading.Event()

    def watch() -> None:
        assert watchdog is not None
        while not stop.wait(WATCH_S):
            found = watchdog()
            if found is not None:
                log.warning("cancelling %r: %s", description, found)
                tripped.append(found)
                _cancel(sc, group)
                return

    if watchdog is not None:
        threading.Thread(target=watch, name=f"{thread_name}-watchdog", daemon=True).start()

    def in_group() -> _T:
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            return action()
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    try:
        return call_on_thread(in_group, thread_name, on_interrupt=lambda: _cancel(sc, group))
    except BaseException as e:
        _cancel(sc, group)  # a failed action may leave sibling jobs of the group running
        if tripped:
            raise tripped[0] from e
        raise
    finally:
        stop.set()


def run_job(
    sc: Any,
    description: str,
    job: Callable[[], _T],
    thread_name: str = "torchspark-job",
    reported_errors: Callable[[], list[tuple[int, str]]] | None = None,
    watchdog: Callable[[], BaseException | None] | None = None,
) -> _T:
    """Run ``job`` (a callable that submits Spark actions) under its own job group: Ctrl-C (or any error) on the
    caller cancels it; a failed task raises `task_error`.

    Raises:
        TorchSparkError: what `task_error` makes of a failed task; our own errors raised by ``job`` on the
            driver pass unchanged.
        TrainingError: the Spark driver JVM died (`jvm_died`).
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        return run_in_job_group(sc, description, job, thread_name, watchdog)
    except TorchSparkError:
        raise
    except (PySparkException, Py4JError, ConnectionError) as e:
        how = jvm_gone(sc)
        if how is not None:
            raise jvm_died(description, how) from e
        if isinstance(e, ConnectionError):
            raise
        raise task_error(e, description, reported_errors) from e


def run_barrier_stage(
    sc: Any,
    rdd: Any,
    fn: Callable[[Iterable[Any]], Iterator[WorkerResult]],
    description: str,
    reported_errors: Callable[[], list[tuple[int, str]]] | None = None,
    watchdog: Callable[[], BaseException | None] | None = None,
    profile: Any = None,
) -> list[WorkerResult]:
    """Run ``fn`` as a barrier stage over ``rdd`` (`run_job`, ``watchdog`` as there), under the stage-level
    ``profile`` when one is given (the training stage's GPUs: `torchspark.spark.gpus`); the workers' results
    by rank."""

    def stage() -> list[WorkerResult]:
        mapped = rdd.barrier().mapPartitions(fn)
        return (mapped if profile is None else mapped.withResources(profile)).collect()

    results: list[WorkerResult] = run_job(sc, description, stage, "torchspark-barrier-stage", reported_errors, watchdog)
    return sorted(results, key=lambda r: r.rank)
