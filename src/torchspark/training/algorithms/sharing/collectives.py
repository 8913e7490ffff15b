"""The two small collectives every sharing loop runs besides its exchange: the agreed start threshold and the
epoch's score.

* `calibrate`: before the first encode of a fit whose threshold is not calibrated yet, every worker
  calibrates a threshold from its first update and all start from the geometric mean of the values (one all-gather
  of 8 bytes per worker), as if one process had calibrated;
* `report_epoch_score`: after an epoch, one all-reduce of ``[sum(loss * examples), examples]``; rank 0
  reports the example-weighted mean loss.

Both are collectives: every rank calls them at the same point (never while a mailbox is open).

Example::

    calibrate(state, update, comm)                       # update None on a worker without data
    report_epoch_score(outcome, net, comm, hooks, epoch)  # only when hooks.report_score is set, on every rank
"""

from __future__ import annotations

import logging
import math
import struct

import torch

from torchspark.encoding import agree_threshold, local_calibration, with_calibration
from torchspark.nn import Network
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.state import SharingState
from torchspark.training.comm import Communicator
from torchspark.training.hooks import ScoreReport, WorkerHooks

__all__ = ["calibrate", "report_epoch_score"]

log = logging.getLogger(__name__)


def calibrate(state: SharingState, update: torch.Tensor | None, comm: Communicator) -> None:
    """Agree on the calibrated start threshold: gather every worker's value (NaN: none), take the geometric mean."""
    local = local_calibration(update, state.encoder)
    gathered = comm.all_gather_bytes(struct.pack("<d", math.nan if local is None else local))
    agreed = agree_threshold([struct.unpack("<d", data)[0] for data in gathered])
    state.encoder = with_calibration(state.encoder, agreed)
    if agreed is not None:
        state.start_threshold = state.encoder.threshold_state.threshold
        log.info(
            "gradient sharing: calibrated start threshold %.3g (this worker alone: %s)",
            agreed,
            "no data" if local is None else f"{local:.3g}",
        )


def report_epoch_score(out: EpochOutcome, net: Network, comm: Communicator, hooks: WorkerHooks, epoch: int) -> None:
    """The epoch's example-weighted mean loss over all workers (one all-reduce every rank joins); rank 0 reports."""
    totals = torch.tensor([out.score_sum, float(out.examples)], dtype=torch.float64, device=net.device)
    comm.all_reduce_sum(totals)
    score_sum, examples = (float(v) for v in totals.cpu())
    if comm.rank == 0 and examples > 0 and hooks.report_score is not None:
        hooks.report_score(ScoreReport(epoch, None, int(examples), score_sum / examples))
