"""What ``local_session`` promises, checked on a session of its own (child process, started without
PYSPARK_PYTHON): the settings it applies and their effect on the executors' Python workers, and that every
training worker runs torch with as many threads as its task has cpus (``spark.task.cpus``)."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.fixture(scope="module")
def report(session_settings_run) -> dict:
    proc = session_settings_run  # scripts/session_settings.py, run by tests/background.py's lane
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def test_local_session_applies_its_settings(report: dict) -> None:
    conf = report["conf"]
    assert conf["spark.locality.wait"] == "0", conf
    assert conf["spark.python.worker.reuse"] == "true", conf
    assert conf["spark.barrier.sync.timeout"] == "77", conf  # from rendezvous_timeout_s=77
    assert conf["spark.pyspark.python"] == sys.executable, conf


def test_executors_run_this_interpreter_and_reuse_their_python_workers(report: dict) -> None:
    assert report["driver_python"] == sys.executable
    assert report["worker_pythons"] == [sys.executable], report
    assert len(report["first_job_pids"]) == 2, report
    assert report["second_job_pids"] == report["first_job_pids"], "the second job started new Python workers"


def test_training_workers_use_as_many_torch_threads_as_their_task_has_cpus(report: dict) -> None:
    # 3 cpus per task: not torch's default on this 2-core machine, nor the 1 an unset count would give
    assert report["conf"]["spark.task.cpus"] == "3"
    assert report["worker_threads"] == [3, 3], report
