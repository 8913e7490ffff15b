"""The synchronous gradient-sharing loop (Strom 2015, DL4J's SharedTrainingMaster): `SharingAlgorithm`.

Per minibatch ``t`` on every worker: (1) compute the updater's step ``u_t`` and (2) threshold-encode it against
the residual (`step`); (3) exchange every worker's payload
(`rounds`, over the fit's
`topology`); (4) decode all messages in rank order into one sum
``S_t`` and apply ``params -= S_t``. Every replica applies the same sequence ``S_0, S_1, ...``, so all stay
bit-identical (checked at the end of the fit). With ``overlap=True`` (the default) the exchange of step ``t`` runs
while step ``t+1`` computes: every update misses exactly the most recent step (staleness one step). The epoch ends
on every worker after the first round in which every worker was inactive. The whole round, the overlap and the
end of a fit are described in docs/design.md, "The gradient-sharing round".

Example::

    algo = SharingAlgorithm(SharingSettings(EncoderConfig()))
    state = algo.start(net, comm)
    for epoch in range(epochs):
        algo.epoch(state, net, batches, comm, WorkerHooks(), epoch)
    extra_state, extra_config = algo.finish(state, net, comm)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch

from torchspark.data import Trainable
from torchspark.errors import ConfigError, TrainingError
from torchspark.nn import Network
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.collectives import calibrate, report_epoch_score
from torchspark.training.algorithms.sharing.finish import finish_fit
from torchspark.training.algorithms.sharing.rounds import INACTIVE, Round
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.algorithms.sharing.state import (
    SharingAlgorithmBase,
    SharingState,
    cut_state,
)
from torchspark.training.algorithms.sharing.step import compute_and_encode
from torchspark.training.algorithms.sharing.topology import exchange_phases, resolve_topology
from torchspark.training.comm import Communicator
from torchspark.training.comm.shm import PostedGathers
from torchspark.training.hooks import ProgressUpdate, WorkerHooks

__all__ = ["SharingAlgorithm"]

log = logging.getLogger(__name__)

# How long a failing worker waits for its in-flight exchange before leaving (peers still alive finish it at once).
_DRAIN_S = 10.0


@dataclass(frozen=True)
class SharingAlgorithm(SharingAlgorithmBase):
    """Threshold-encoded gradient sharing, synchronous exchange (mode ``"sharing"``; see the module docstring).

    Raises:
        ConfigError: ``settings.max_staleness`` is set: that is the ``"stale_sharing"`` algorithm
            (`StaleSharingAlgorithm`).
    """

    def __post_init__(self) -> None:
        if self.settings.max_staleness is not None:
            raise ConfigError(
                f"SharingAlgorithm is the synchronous loop, but max_staleness="
                f"{self.settings.max_staleness}: bounded staleness is the 'stale_sharing' algorithm "
                "(StaleSharingAlgorithm); SharedTrainingMaster picks it from max_staleness"
            )

    def epoch(
        self,
        state: SharingState,
        net: Network,
        batches: Iterable[Trainable],
        comm: Communicator,
        hooks: WorkerHooks,
        epoch: int,
    ) -> EpochOutcome:
        """One pass over this worker's batches; returns when every worker's data ran out."""
        out = EpochOutcome()
        it = iter(batches)
        exhausted = False
        rec = hooks.recorder
        topology = resolve_topology(
            self.settings.topology, self.settings.shard_above_workers, comm.world_size, self.settings.codec
        )
        transport, finish = exchange_phases(topology, net.num_params(), net.device, self.settings.codec)
        posted = _posted_gathers(self.settings, comm, topology)
        executor = (
            ThreadPoolExecutor(1, thread_name_prefix="torchspark-sharing-exchange")
            if self.settings.overlap and posted is None
            else None
        )
        overlap = self.settings.overlap
        state.overlap_via = "shared_memory" if posted is not None else "thread" if overlap else "off"
        pending: Future[Any] | _Posted | None = None
        resumed, state.pending_payload = state.pending_payload, None
        try:
            if resumed is not None:  # a checkpoint's in-flight step goes out first, as it did before the cut
                if not overlap:
                    raise TrainingError("a checkpoint taken with overlap=True cannot resume with overlap=False")
                pending = _send(posted, executor, transport, comm, resumed)
                state.bytes_sent += len(resumed)
                out.rounds += 1
            while True:
                # 1 + 2: compute and encode (overlaps the exchange of the previous step)
                batch = None
                if not exhausted:
                    with rec.phase("data_wait"):
                        batch = next(it, None)
                    exhausted = batch is None
                # calibrate on the first round: the same decision on every worker, and nothing is in flight yet
                first = out.rounds == 0 and not state.encoder.threshold_state.calibrated
                if batch is None:
                    if first:
                        calibrate(state, None, comm)
                    payload = INACTIVE
                else:
                    payload = compute_and_encode(
                        state, net, batch, out, hooks, comm, epoch, first, self.settings.on_divergence
                    )
                # 3 + 4: exchange, decode in rank order, apply
                if not overlap:
                    with rec.phase("exchange"):
                        done = _apply(net, finish(transport(comm, payload)))
                else:
                    if pending is not None:
                        with rec.phase("exchange"):
                            in_flight, pending = pending, None  # _shutdown must not wait on it again
                            if _apply(net, finish(in_flight.result())):
                                break  # every worker was inactive in the previous round, so is in this one
                    if hooks.checkpoint is not None:  # the cut: S_{t-1} applied, this step's payload not yet sent
                        hooks.checkpoint(out, *cut_state(state, payload))
                    pending = _send(posted, executor, transport, comm, payload)
                    done = False
                state.bytes_sent += len(payload)
                out.rounds += 1
                if done:
                    break
                if not overlap and hooks.checkpoint is not None:  # the cut: this step applied everywhere
                    hooks.checkpoint(out, *cut_state(state, None))
            if posted is not None:  # every round collected on every rank: release the segment's halves
                posted.close()
        finally:
            if executor is not None:
                _shutdown(executor, pending if isinstance(pending, Future) else None)
        if hooks.progress is not None and out.iterations % hooks.progress_every:  # the epoch's last count
            hooks.progress(ProgressUpdate(comm.rank, epoch, out.iterations, out.examples, out.last_score))
        if hooks.report_score is not None:
            report_epoch_score(out, net, comm, hooks, epoch)
        return out

    def finish(
        self, state: SharingState, net: Network, comm: Communicator
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """End of fit (`finish_fit`), plus
        ``sharing.topology`` (the exchange this fit used) and ``sharing.overlap_via`` in ``extra_config``."""
        extra_state, extra_config = finish_fit(state, net, comm)
        extra_config["sharing.topology"] = resolve_topology(
            self.settings.topology, self.settings.shard_above_workers, comm.world_size, self.settings.codec
        )
        extra_config["sharing.codec"] = state.compressor.name
        extra_config["sharing.overlap_via"] = state.overlap_via
        return extra_state, extra_config


class _Posted:
    """A round posted through `PostedGathers`: ``result()`` collects it (the
    gathered payloads, as the exchange thread's future would return them)."""

    __slots__ = ("_gathers",)

    def __init__(self, gathers: PostedGathers) -> None:
        self._gathers = gathers

    def result(self) -> list[bytes]:
        return self._gathers.collect()


def _posted_gathers(settings: SharingSettings, comm: Communicator, topology: str) -> PostedGathers | None:
    """Split-phase gathers for this epoch's overlapped all-gather when the communicator has them (every rank on
    one host, FIFO barriers): the training thread posts its payload and collects the round after computing the
    next step, with no exchange thread. The same decision on every rank (collective)."""
    opener = getattr(comm, "posted_gathers", None)
    if not settings.overlap or opener is None or topology != "all_gather":
        return None
    return opener()


def _send(
    posted: PostedGathers | None,
    executor: ThreadPoolExecutor | None,
    transport: Callable[[Communicator, bytes], Any],
    comm: Communicator,
    payload: bytes,
) -> Future[Any] | _Posted:
    """Start exchanging ``payload``: post it (split-phase gathers) or hand it to the exchange thread."""
    if posted is not None:
        posted.post(payload)
        return _Posted(posted)
    assert executor is not None
    return executor.submit(transport, comm, payload)


def _apply(net: Network, result: Round) -> bool:
    """Step 4b: ``params -= S_t``. Returns True when no worker was active (the epoch is over everywhere)."""
    if result.total is not None:
        if result.indices is not None:
            net.apply_update_at(result.indices, result.total)
        else:
            net.apply_update(result.total)
    return result.active == 0


def _shutdown(executor: ThreadPoolExecutor, pending: Future[Any] | None) -> None:
    """Leave no exchange thread behind. Normal exit: nothing pending. On an error: let the in-flight exchange
    finish (live peers complete it at once) for up to ``_DRAIN_S`` seconds, so the process group is not torn
    down under a running collective."""
    if pending is not None:
        try:
            pending.result(timeout=_DRAIN_S)
        except FutureTimeout:
            log.warning("an in-flight gradient exchange did not finish within %.0f s after a worker error", _DRAIN_S)
            executor.shutdown(wait=False, cancel_futures=True)
            return
        except Exception as e:  # noqa: BLE001 - the error that ended the epoch is already propagating
            log.debug("in-flight gradient exchange failed during shutdown: %s", e)
    executor.shutdown(wait=True)
