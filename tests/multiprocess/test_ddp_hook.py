"""Threshold gradient sharing as a DDP communication hook (torchspark.ddp): 2 real gloo processes on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from _ddp_hook_worker import run
from _ranks import run_ranks

EPOCHS = 4
SGD_EPOCHS = 16  # the accuracy comparison: plain SGD, both runs converged (BENCHMARKS.md has the curves)


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    got = run_ranks(run, 2, EPOCHS, SGD_EPOCHS, timeout_s=600.0)  # ~55 s on an idle 2-core machine, 210 s under CI load
    for report in got:
        assert "error" not in report, report["error"]
    return got


def test_replicas_are_bit_identical(reports: list[dict[str, Any]]) -> None:
    for case in ("mlp", "cnn", "wrapper", "sgd"):
        sums = reports[0][case]["checksums"]
        assert len(sums) == 2 and sums[0] == sums[1], (case, sums)
        assert reports[1][case]["checksums"] == sums
    steps_per_epoch = (1437 // 2) // 32
    assert reports[0]["mlp"]["iteration"] == EPOCHS * steps_per_epoch
    assert reports[0]["cnn"]["iteration"] == steps_per_epoch


def test_at_least_100x_fewer_bytes_than_allreduce(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        mlp = report["mlp"]
        assert mlp["dense_bytes"] == 4 * (64 * 64 + 64 + 64 * 10 + 10) * mlp["iteration"]
        assert mlp["bytes_sent"] > 0
        assert mlp["dense_bytes"] / mlp["bytes_sent"] >= 100, mlp


def test_accuracy_within_one_point_of_allreduce_with_sgd(reports: list[dict[str, Any]]) -> None:
    """Issue 45's target, met with plain SGD (lr 0.3): at the hook's defaults, >= 100x fewer bytes and a test accuracy
    (mean of the last 4 of 16 epochs, which evens out the epoch-to-epoch noise of both runs) within 1 point of
    all-reduce DDP's. Measured: 0.961 against 0.958 at 173x fewer bytes."""
    sgd = reports[0]["sgd"]
    hook, plain = sum(sgd["hook"][-4:]) / 4, sum(sgd["allreduce"][-4:]) / 4
    assert plain > 0.94, sgd  # the baseline converged
    assert hook >= plain - 0.01, sgd
    assert sgd["compression"] >= 100, sgd
    assert sgd["hook"][0] < sgd["hook"][-1]  # it learned over the run, not by the first epoch's chance


def test_accuracy_against_allreduce_with_adam(reports: list[dict[str, Any]]) -> None:
    """With Adam the hook trails all-reduce (measured after 4 epochs: 0.78 against 0.93; after 20: 0.936 against
    0.964): Adam divides each entry by its gradient's RMS, and an entry the hook sends as an occasional +-t pulse has
    an RMS of about sqrt(t * |g|), far above |g|, so Adam's step on it shrinks by about sqrt(|g| / t)
    (docs/guides/ddp-hook.md). This is the honest bound for the short Adam run."""
    hook, plain = reports[0]["mlp"]["accuracy"], reports[0]["allreduce_accuracy"]
    assert plain > 0.8  # the baseline learned
    assert hook > 0.55 and plain - hook < 0.3, (hook, plain)  # sending nothing stays near chance (0.1)
    assert reports[0]["wrapper"]["moved"]  # ThresholdGradients trained (rank 1 started elsewhere: broadcast)


def test_state_dict_round_trip(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        state = report["state"]
        assert state["residual_equal"] and state["residual_nonzero"]
        restored, original = state["thresholds"]
        assert restored == original and original is not None
        assert state["counters"][:2] == state["counters"][2:]


def test_ranks_with_different_shapes_fail_with_the_fix(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert report["mismatch"] is not None
        assert report["mismatch"].startswith("SetupError")
        assert "every rank must build the same model" in report["mismatch"]
