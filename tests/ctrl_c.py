"""Ctrl-C during a Spark job: press it once a job runs, then check the job was cancelled (not run to completion)."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest


def never_ending_job(sc: Any) -> Callable[[], list[int]]:
    """An action whose tasks sleep 120 s: it only ends early when cancelled."""

    def sleep_until_cancelled(x: int) -> int:  # local, so Spark pickles it by value (tests are not importable)
        time.sleep(120)
        return x

    return lambda: sc.parallelize(range(2), 2).map(sleep_until_cancelled).collect()


def assert_ctrl_c_cancels(sc: Any, run: Callable[[], Any], what: str) -> None:
    """``run()`` (which submits the job) must raise KeyboardInterrupt on Ctrl-C and leave its job cancelled."""
    job_ids: list[int] = []

    def press_ctrl_c_once_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            active = sc.statusTracker().getActiveJobsIds()
            if active:
                job_ids.extend(active)
                _thread.interrupt_main()
                return
            time.sleep(0.05)

    threading.Thread(target=press_ctrl_c_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run()
    deadline = time.monotonic() + 60
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sc.statusTracker().getActiveJobsIds(), f"the {what} job kept running after Ctrl-C"
    info = sc.statusTracker().getJobInfo(job_ids[0])
    assert info is not None and info.status == "FAILED", f"the {what} job must be cancelled, not run to completion"
    assert sc.parallelize(range(4), 2).sum() == 6  # the session still works
