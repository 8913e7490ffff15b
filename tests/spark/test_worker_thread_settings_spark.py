"""A training task gives its reused Spark Python worker back with the torch thread count and flush-denormal mode
it found (``spark.python.worker.reuse`` is on: the next task in that process, perhaps not torchspark's, must not
inherit the training task's settings). In its own Spark process: it changes its worker's settings on purpose."""

from __future__ import annotations

import json


def test_a_reused_python_worker_gets_its_thread_count_and_flush_mode_back(thread_settings_run) -> None:
    proc = thread_settings_run  # scripts/worker_thread_settings.py torch spark, run by tests/background.py's lane
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = {r["via"]: r for r in map(json.loads, proc.stdout.strip().splitlines()[-2:])}
    assert sorted(reports) == ["spark", "torch"]
    for via, report in reports.items():
        before, after = report["before"], report["after"]
        assert before["pid"] == after["pid"], f"{via}: the worker was not reused, so this checks nothing"
        assert (before["threads"], before["flushed"]) == (3, True)
        assert (after["threads"], after["flushed"]) == (3, True), f"{via}: the training task's settings stayed"
    assert reports["torch"]["trained_threads"] == [1]  # the task trained with its slot's 1 thread, then restored
