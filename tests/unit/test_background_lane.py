"""The suite's background lane (``tests/background.py``): runs started ahead hand their finished result to the test
that asks, a run not started ahead runs in the asking test, and closing the lane ends the run in progress."""

from __future__ import annotations

import pytest

from background import BackgroundLane, ChildRun


def _python(code: str, timeout_s: float = 60) -> ChildRun:
    return ChildRun(("-c", code), timeout_s=timeout_s, set_env={"LANE_CHECK": "set"})


def test_runs_started_ahead_hand_their_output_and_the_snapshot_taken_before_them() -> None:
    snapshots = iter(range(10))
    runs = {"a": _python("import os; print(os.environ['LANE_CHECK'])"), "b": _python("import sys; sys.exit(3)")}
    lane = BackgroundLane(snapshot=lambda: next(snapshots), runs=runs)
    lane.start(["a", "b"])
    try:
        a, b = lane.result("a"), lane.result("b")
    finally:
        lane.close()
    assert (a.returncode, a.stdout, a.before) == (0, "set\n", 0)
    assert (b.returncode, b.before) == (3, 1)  # one after the other, each with its own snapshot


def test_a_run_not_started_ahead_runs_in_the_asking_test() -> None:
    lane = BackgroundLane(runs={"late": _python("print('here')")})
    lane.start([])
    try:
        assert lane.result("late").stdout == "here\n"
    finally:
        lane.close()


def test_a_run_past_its_timeout_is_killed_and_says_so() -> None:
    lane = BackgroundLane(runs={"slow": _python("import time; time.sleep(600)", timeout_s=1)})
    done = lane.result("slow")
    assert done.returncode != 0 and "ran past its 1 s timeout" in done.stderr


def test_closing_the_lane_ends_the_run_in_progress_and_skips_the_rest() -> None:
    runs = {"long": _python("import time; time.sleep(600)", timeout_s=600), "next": _python("print(1)")}
    lane = BackgroundLane(runs=runs)
    lane.start(["long", "next"])
    assert lane.wait_started(timeout_s=60)
    lane.close()
    assert lane.result("long").returncode != 0  # killed, not slept out
    with pytest.raises(RuntimeError, match="closed before 'next' ran"):
        lane.result("next")
