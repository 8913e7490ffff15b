"""Steps 1 + 2 of a sharing round on one worker: compute the update, check it, encode it into the round's payload.

Shared by the synchronous loop and bounded staleness. Once the threshold is calibrated the update goes straight
into the residual (`fused`); on the first round of an uncalibrated fit
the update is computed apart, the start threshold agreed from it
(`calibrate`), then encoded. Every update passes the
divergence check (``on_divergence``: raise, or warn once).

Example::

    payload = compute_and_encode(state, net, batch, outcome, hooks, comm, epoch, calibrate=False,
                                 on_divergence="fail")
"""

from __future__ import annotations

import logging

from torchspark.data import Trainable, group_examples
from torchspark.encoding import encode_step
from torchspark.errors import TrainingError
from torchspark.nn import Network
from torchspark.nn.divergence import update_divergence
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.collectives import calibrate as calibrate_threshold
from torchspark.training.algorithms.sharing.fused import can_fuse, step_into_residual
from torchspark.training.algorithms.sharing.rounds import pack
from torchspark.training.algorithms.sharing.state import SharingState
from torchspark.training.comm import Communicator
from torchspark.training.hooks import ProgressUpdate, WorkerHooks

__all__ = ["compute_and_encode", "report_divergence"]

log = logging.getLogger(__name__)


def compute_and_encode(
    state: SharingState,
    net: Network,
    batch: Trainable,
    out: EpochOutcome,
    hooks: WorkerHooks,
    comm: Communicator,
    epoch: int,
    calibrate: bool,
    on_divergence: str,
) -> bytes:
    """This worker's payload for one round (`pack`): one
    updater step on ``batch`` (a minibatch, or a group of them with gradient accumulation) encoded against the
    residual. Counts the step in ``out`` and ``state``, records it
    (phase ``fit``, ``record_encoding``, ``record_score``) and reports progress every ``hooks.progress_every``.

    Args:
        calibrate: agree on the start threshold from this update first (a collective: every rank passes the same).
        on_divergence: ``"fail"`` or ``"warn"`` (see `report_divergence`).
    """
    rec = hooks.recorder
    rank = comm.rank
    step = net.iteration
    validate = epoch == 0 and out.iterations == 0
    examples = group_examples(batch)
    with rec.phase("fit", examples=examples):
        if calibrate or not can_fuse(state, net):
            update = net.compute_update(batch, validate=validate)
            report_divergence(state, net, float(update.norm()), float(net.params_view().norm()), step, on_divergence)
            if calibrate:
                calibrate_threshold(state, update, comm)
            message, state.encoder = encode_step(update, state.encoder, step)
        else:  # the same steps, the update moved into the residual while the parameters are restored
            update_norm, param_norm = step_into_residual(state, net, batch, validate)
            report_divergence(state, net, update_norm, param_norm, step, on_divergence)
            message, state.encoder = encode_step(None, state.encoder, step)
    payload = pack(message)
    dense = 4 * net.num_params()
    state.dense_bytes += dense
    state.steps += 1
    rec.record_encoding(step, len(payload), dense, message.density, message.threshold, message.format)
    out.iterations += 1
    out.examples += examples
    out.last_score = net.last_score
    out.score_sum += net.last_score * examples
    rec.record_score(net.iteration, net.last_score)
    if hooks.progress is not None and out.iterations % hooks.progress_every == 0:
        hooks.progress(
            ProgressUpdate(
                rank,
                epoch,
                out.iterations,
                out.examples,
                net.last_score,
                state.bytes_sent + len(payload),
                state.dense_bytes,
            )
        )
    return payload


def report_divergence(
    state: SharingState, net: Network, update_norm: float, param_norm: float, step: int, on_divergence: str
) -> None:
    """Divergence never passes silently: raise TrainingError (``on_divergence="fail"``), or log it once and remember
    it in ``state.divergence`` (``"warn"``)."""
    message = update_divergence(update_norm, param_norm, net.last_score, step, net.updater)
    if message is None or state.divergence is not None:
        return
    if on_divergence == "fail":
        raise TrainingError(f"{message} (on_divergence='warn' only warns)")
    state.divergence = message
    log.warning("gradient sharing: %s Training goes on (on_divergence='warn').", message)
