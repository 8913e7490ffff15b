"""Steps 1 + 2 of a sharing round on one worker: compute the update, check it, encode it into the round's payload.

Shared by the synchronous loop and bounded staleness. Once the threshold is calibrated the update goes straight
into the residual (`fused`); on the first round of an uncalibrated fit
the update is computed apart, the start threshold agreed from it
(`calibrate`), then encoded. Every update passes the
divergence check (``on_divergence``: raise, or warn once). A gradient that is not finite never gets that far: the
network refuses the updater step (`NonFiniteGradient`), so nothing enters the
residual or the updater state; with ``"warn"`` this worker sends an empty message for the step (the parameters
move by the other workers' messages alone, identically on every replica) and counts it in
``SharingState.skipped_steps``; with ``"fail"`` the fit ends with that error, which names the data or the model.

Example::

    payload = compute_and_encode(state, net, batch, outcome, hooks, comm, epoch, calibrate=False,
                                 on_divergence="fail")
"""

from __future__ import annotations

import logging

import torch

from torchspark.data import Trainable, group_examples
from torchspark.encoding import EncodedUpdate
from torchspark.errors import TrainingError
from torchspark.nn import Network
from torchspark.nn.divergence import NonFiniteGradient, update_divergence
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.collectives import calibrate as calibrate_threshold
from torchspark.training.algorithms.sharing.fused import can_fuse, step_into_residual
from torchspark.training.algorithms.sharing.rounds import pack
from torchspark.training.algorithms.sharing.state import SharingState
from torchspark.training.comm import Communicator
from torchspark.training.hooks import ProgressUpdate, WorkerHooks

__all__ = ["compute_and_encode", "report_divergence", "skip_step"]

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
        try:
            if calibrate or not can_fuse(state, net):
                update = net.compute_update(batch, validate=validate)
                norms = float(update.norm()), float(net.params_view().norm())
                report_divergence(state, net, *norms, step, on_divergence)
                if calibrate:
                    calibrate_threshold(state, update, comm)
                message, state.encoder = state.compressor.encode(update, state.encoder, step)
            else:  # the same steps, the update moved into the residual while the parameters are restored
                update_norm, param_norm = step_into_residual(state, net, batch, validate)
                report_divergence(state, net, update_norm, param_norm, step, on_divergence)
                message, state.encoder = state.compressor.encode(None, state.encoder, step)
        except NonFiniteGradient as e:  # raised before the updater stepped: residual and updater state untouched
            message = skip_step(state, net, e, on_divergence)
            if calibrate:  # a collective: join it as a worker without an update does
                calibrate_threshold(state, None, comm)
    payload = pack(message, state.codec)
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


def skip_step(state: SharingState, net: Network, error: NonFiniteGradient, on_divergence: str) -> EncodedUpdate:
    """A step whose gradient was not finite: re-raise it (``on_divergence="fail"``), or count it in
    ``state.skipped_steps``, log the first one (kept in ``state.divergence`` for the driver's warning) and return
    the empty message this worker sends for the step. The network's counters advance as for a step fp16's scaler
    skips, so every replica keeps the same iteration count (learning-rate schedules, clipping steps)."""
    if on_divergence == "fail":
        raise NonFiniteGradient(
            f"{error} (on_divergence='warn' skips such steps and counts them)", error.iteration, error.loss, error.bad
        ) from error
    state.skipped_steps += 1
    if state.divergence is None:
        state.divergence = f"{error}; the step was skipped"
        log.warning("gradient sharing: %s; the step was skipped (on_divergence='warn').", error)
    net.iteration += 1
    net.last_score = error.loss
    residual = state.encoder.residual
    return EncodedUpdate("empty", residual.numel(), 0.0, torch.empty(0, dtype=torch.int32, device=residual.device), 0)


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
