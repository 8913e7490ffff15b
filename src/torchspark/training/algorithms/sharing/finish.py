"""The end of a sharing fit, for both sharing algorithms: average what stayed local, verify the replicas, hand back
what persists.

During a fit each worker keeps its own updater state, floating-point module buffers (BatchNorm running
statistics) and threshold state; `finish_fit` averages them over the workers (DL4J does the same), checks
that every replica's parameters and averaged buffers are bit-identical (SHA-256 of each, all-gathered), and returns
this rank's residual and the averaged threshold state for ``net.extra_state`` (the next fit starts from them, see
`start_state`) plus the fit's ``sharing.*`` report. A
collective: every rank calls it once, after its last epoch.

Example::

    extra_state, extra_config = finish_fit(state, net, comm)
    extra_config["sharing.replica_sha256"]   # equal on every rank
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from torchspark.encoding import NUM_SUMMANDS, ThresholdState, average_from_sums, state_summands
from torchspark.errors import TrainingError
from torchspark.nn import Network
from torchspark.training.algorithms.sharing.state import RESIDUAL_KEY, THRESHOLD_KEY, WORLD_KEY, SharingState
from torchspark.training.comm import Communicator

__all__ = ["finish_fit"]


def finish_fit(state: SharingState, net: Network, comm: Communicator) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """End of fit: average updater state, module buffers and threshold state, verify the replicas, hand back what
    must persist.

    Returns:
        ``extra_state``: this rank's residual (``sharing.residual.<rank>``), the averaged threshold state and the
        world size; ``extra_config``: world size, the fit's summed ``bytes_sent`` /
        ``dense_bytes`` over all workers, the averaged end ``threshold``, the ``start_threshold`` (calibrated or
        configured), ``divergence`` (the first worker's divergence message with ``on_divergence="warn"``, else
        None), ``skipped_steps`` (steps skipped over all workers for a gradient that was not finite) and ``replica_sha256`` (hex SHA-256 of every replica's float32 parameters followed by its averaged
        buffers, equal on all ranks); all ranks return the same config, the driver keeps rank 0's.

    Raises:
        TrainingError: the replicas' parameters differ (a worker applied a different message sequence), or their
            averaged buffers do (the communicator returned different sums).
    """
    world = comm.world_size
    averaged, bytes_sent, dense_bytes, skipped = _average_local_state(state, net, comm)  # 1, 1b, 2
    # 3. the replicas must be bit-identical: the parameters, and the buffers just averaged (all-reduce results
    # are identical on every rank, so a difference there means a broken transport; empty without buffers)
    digest = hashlib.sha256(net.params().cpu().numpy().tobytes())
    digest.update(net.buffers().cpu().numpy().tobytes())
    digests = comm.all_gather_bytes(digest.digest())
    differing = [r for r, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise TrainingError(
            f"gradient-sharing replicas diverged: the parameters or averaged buffers of worker(s) "
            f"{differing} differ from worker 0's after the fit; every worker must apply the same "
            "messages (check that all workers run the same torchspark/torch versions and devices)"
        )
    # 4. divergence a worker only warned about (on_divergence="warn"): every rank learns the first one
    warned = [d.decode() for d in comm.all_gather_bytes((state.divergence or "").encode()) if d]
    if warned and skipped:
        warned[0] += (
            f" ({int(skipped)} step(s) skipped over all workers for a gradient that was not finite; "
            "net.extra_config['sharing.skipped_steps'])"
        )
    extra_state = {
        RESIDUAL_KEY.format(rank=comm.rank): state.encoder.residual.detach().cpu().clone(),
        THRESHOLD_KEY: averaged.to_tensor(),
        WORLD_KEY: torch.tensor([world], dtype=torch.int64),
    }
    extra_config = {
        "sharing.world_size": world,
        "sharing.bytes_sent": int(bytes_sent),
        "sharing.dense_bytes": int(dense_bytes),
        "sharing.threshold": averaged.threshold,
        "sharing.start_threshold": state.start_threshold,
        "sharing.replica_sha256": digests[0].hex(),
        "sharing.divergence": warned[0] if warned else None,
        "sharing.skipped_steps": int(skipped),
    }
    return extra_state, extra_config


def _average_local_state(
    state: SharingState, net: Network, comm: Communicator
) -> tuple[ThresholdState, float, float, float]:
    """Steps 1, 1b and 2 of `finish_fit`: the updater state and float buffers averaged in place; returns the
    averaged threshold state and the fit's ``bytes_sent`` / ``dense_bytes`` / ``skipped_steps`` summed over all
    workers."""
    world = comm.world_size
    # 1. updater state: local during the fit, averaged now (DL4J)
    updater = net.updater_state().to(net.device)
    if updater.numel():
        comm.all_reduce_sum(updater)
        net.set_updater_state(updater / world)
    # 1b. floating-point module buffers (BatchNorm running statistics): local during the fit, averaged now.
    # Averaging once is as good as after every step: the replicas share their parameters and step count, so
    # each worker's running statistic is the same moving average of its own batch statistics, and the mean of
    # those averages is the moving average of the mean batch statistics. Nor do they feed back into training
    # (train-mode BatchNorm normalises with the batch's own statistics). Integer buffers (num_batches_tracked)
    # stay per worker; the driver takes worker 0's.
    buffers = net.buffers()
    if buffers.numel():
        comm.all_reduce_sum(buffers)
        net.set_buffers(buffers / world)
    # 2. threshold state, average_states semantics: means over the workers that stepped in this fit (those
    # with a sparsity); the plain mean of the unchanged thresholds when none did
    summary = torch.tensor(
        [
            *state_summands(state.encoder.threshold_state),
            float(state.bytes_sent),
            float(state.dense_bytes),
            float(state.skipped_steps),
        ],
        dtype=torch.float64,
        device=net.device,
    )
    comm.all_reduce_sum(summary)
    totals = [float(v) for v in summary.cpu()]
    averaged = average_from_sums(totals[:NUM_SUMMANDS], world)
    bytes_sent, dense_bytes, skipped = totals[NUM_SUMMANDS:]
    return averaged, bytes_sent, dense_bytes, skipped
