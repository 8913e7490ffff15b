"""Early stopping without MaxEpochs or MaxTime stops at a limit with a clear reason (issue 31)."""

from __future__ import annotations

from torchspark import Network, models, optim
from torchspark.earlystopping import EarlyStoppingConfiguration, InvalidScore, MaxEpochs, TerminationReason
from torchspark.earlystopping.trainer import UNBOUNDED_EPOCH_LIMIT, run_early_stopping


class _Constant:
    """A score calculator whose score never changes (so no score condition fires)."""

    minimize = True

    def calculate(self, network: Network) -> float:
        return 1.0


def _run(conditions: list, epochs_cap: int) -> tuple[object, int]:
    calls = [0]

    def fit_epoch() -> float:
        calls[0] += 1
        if calls[0] > epochs_cap:  # the old behaviour: it would go on for ever
            raise RuntimeError("still running")
        return 0.5

    net = Network(models.mlp(2, 2, 2), updater=optim.Adam(lr=1e-3), seed=0)
    config = EarlyStoppingConfiguration(_Constant(), iteration_conditions=conditions)
    return run_early_stopping(config, net, fit_epoch), calls[0]


def test_only_invalid_score_stops_at_the_limit_with_a_reason() -> None:
    result, epochs = _run([InvalidScore()], epochs_cap=UNBOUNDED_EPOCH_LIMIT * 3)
    assert epochs == UNBOUNDED_EPOCH_LIMIT == result.total_epochs
    assert result.termination_reason is TerminationReason.EPOCH_CONDITION
    assert "add MaxEpochs(n) or MaxTime(seconds)" in result.termination_details


def test_a_bounded_run_is_not_cut_at_the_limit() -> None:
    net = Network(models.mlp(2, 2, 2), updater=optim.Adam(lr=1e-3), seed=0)
    config = EarlyStoppingConfiguration(_Constant(), epoch_conditions=[MaxEpochs(UNBOUNDED_EPOCH_LIMIT + 5)])
    result = run_early_stopping(config, net, lambda: 0.5)
    assert result.total_epochs == UNBOUNDED_EPOCH_LIMIT + 5
