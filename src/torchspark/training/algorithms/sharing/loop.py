"""Gradient sharing (Strom 2015, DL4J's SharedTrainingMaster) as a worker loop.

Per minibatch ``t`` on every worker:
  1. ``u_t = net.compute_update(batch)``: the step the worker's own updater would take (its updater state
     advances; the parameters do not move);
  2. ``m_t = encode_step(u_t, residual)``: threshold encoding against the worker's residual (what is not sent stays
     in the residual and goes out later);
  3. every worker's ``[active flag | to_bytes(m_t)]`` is exchanged with ``comm.all_gather_bytes``;
  4. every worker decodes all messages **in rank order** into one zeroed buffer ``S_t`` (own message included) and
     applies ``params -= S_t``. Nobody applies its own full-precision update, and the decode order and arithmetic
     are the same everywhere, so all replicas stay bit-identical (checked by :meth:`SharingAlgorithm.finish`).

Hot path (fewer passes over the parameters; ``tests/unit/test_sharing_fused.py``). Once the threshold is calibrated,
steps 1 + 2a are one updater step that lands in the residual itself (:meth:`Network.train_step_into`: the parameters
do not move, no snapshot and no restore; exact for torchspark's updaters without weight decay, whose step does not
read the parameter values; ``u`` is then added without the rounding of ``p - (p - u)``, so the residual differs
from ``compute_update``'s in the last bits). With weight decay or a user-built optimizer: one updater step, then
one pass that moves it into the residual and restores the parameters (bit-identical to the unfused steps).
Divergence norms from dot products (with the direct step the residual's norm stands in for the update's). When every message of a round is sparse (the usual case), step 4 sums them at the union of their indices
only (from 0, in rank order, as the zeroed buffer would) and subtracts there (:func:`_exchange_sparse`); ``x - 0 ==
x`` elsewhere, so the parameters are bit-identical to the dense decode and apply.

Calibrated start (the default threshold policies). Before the first encode of an epoch whose threshold state is
not calibrated yet (the first epoch of a fresh fit), every worker computes its first update, calibrates a threshold
from it (:func:`~torchspark.encoding.local_calibration`; NaN without data), the values are exchanged with one
all-gather of 8 bytes per worker, and every worker starts from their geometric mean
(:func:`~torchspark.encoding.agree_threshold`), computed in rank order from the same gathered bytes: all workers
use one threshold, as if one process had calibrated. A restored threshold state (next fit) is never recalibrated.

Staleness (``overlap=True``, the default). The exchange of step ``t`` (the all-gather; with the sharded topology
also its decoding) runs on a background thread while step ``t+1`` computes, and ``S_t`` is applied right after
``u_{t+1}`` is encoded, before step ``t+2`` computes. So the parameters used to compute ``u_{t+1}`` contain ``S_0 .. S_{t-1}`` but not ``S_t``: every update is
computed from parameters missing exactly the most recent step (staleness one step, never more). In order::

    compute u_{t+1} | exchange t in flight  ->  wait S_t, apply S_t  ->  start exchange t+1  ->  compute u_{t+2} ...

When every worker is on one host (ParallelWrapper, ``local[N]``, executors of one machine) and the communicator
offers posted gathers (:class:`~torchspark.training.comm.shm.PostedGathers`: the all-gather through shared memory, split
into "post my message" and "collect the round"), there is no exchange thread: the training thread posts ``m_t``,
computes ``u_{t+1}``, then collects round ``t``; same order, same staleness, no thread hand-off or GIL contention per
step (``extra_config["sharing.overlap_via"]`` says which ran).

With ``overlap=False`` the loop is synchronous: exchange ``t``, apply ``S_t``, then compute ``u_{t+1}`` (no
staleness). Either way every worker applies the same sequence ``S_0, S_1, ...``. The staleness can cost accuracy
per step (BENCHMARKS.md, "Stragglers": the benchmark MLP with Adam learns about half as much in its first epoch;
Adam's steps applied one step late without any encoding lose as much). Only the background thread issues
collectives during an epoch (one single-thread executor per epoch), the main thread only computes, decodes and
applies (:func:`_exchange_phases` says why it decodes).

Bounded staleness (``max_staleness=k``, default None = the loop described here): a worker applies its peers'
messages as they arrive and waits only when it is more than ``k`` steps ahead of its slowest peer; the replicas are
averaged at the end of the fit. That loop lives in :mod:`torchspark.training.algorithms.sharing.stale`.

Termination. A worker whose data ran out sends an inactive flag and no message, and keeps joining exchanges. The
epoch ends on every worker at once, after the first exchange in which every worker was inactive (so nothing is
pending). All decisions come from gathered values, so unequal partitions never hang; every wait is a collective
and carries the communicator's timeout (``rendezvous_timeout_s``).

Score reports (``hooks.report_score``). No round averages anything here, so the analogue of parameter averaging's
averaged round score is per epoch: after the epoch, one small all-reduce of ``[sum(loss * examples), examples]``
over every minibatch of every worker, and rank 0 reports the example-weighted mean loss of the epoch. Only when the
hook is set (on every rank, so all join the all-reduce); otherwise the loop runs no extra collective.

Stats (``hooks.recorder``). Phases: ``data_wait`` (next minibatch), ``fit`` (compute_update + encode),
``exchange`` (with overlap: only the time the main thread waits for the in-flight exchange and applies it, i.e.
the part not hidden behind computation; without: the whole exchange). Per encoded step ``record_encoding`` with
``bytes_sent`` = payload handed to the exchange (1 flag byte + message; the transport may pad messages to the
longest one of the round) and ``dense_bytes = 4 * num_params``. Inactive rounds (1 byte) are counted in the fit's
``sharing.bytes_sent`` total but not recorded as encoding steps.

State across epochs, fits and saves. Residuals and the threshold state live for the whole fit. At the end of a fit
(:meth:`SharingAlgorithm.finish`) the updater state, the module's floating-point buffers (BatchNorm running
statistics; integer ones such as ``num_batches_tracked`` stay per worker) and the threshold state are averaged over
workers (DL4J), the replicas (parameters and buffers) are compared, and each rank returns its residual as
``net.extra_state["sharing.residual.<rank>"]`` plus
``"sharing.threshold_state"`` and ``"sharing.world_size"``; ``Network.save`` writes them, and the next fit
restores them (see :meth:`SharingAlgorithm.start`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import torch

from torchspark.data import Batch
from torchspark.encoding import (
    NUM_SUMMANDS,
    EncodedUpdate,
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    ThresholdState,
    accumulate_step,
    agree_threshold,
    average_from_sums,
    decode,
    encode_step,
    from_bytes,
    local_calibration,
    sparse_decode_sum,
    state_summands,
    to_bytes,
    with_calibration,
)
from torchspark.encoding.codec import sparse_sum_entries
from torchspark.encoding.wire import sparse_view
from torchspark.errors import ConfigError, EncodingError, TrainingError
from torchspark.nn import Network
from torchspark.nn.divergence import check_on_divergence, update_divergence
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.topology import (
    DEFAULT_SHARD_ABOVE_WORKERS,
    check_topology,
    resolve_topology,
)
from torchspark.training.comm import Communicator
from torchspark.training.comm.shm import PostedGathers
from torchspark.training.hooks import ProgressUpdate, ScoreReport, WorkerHooks

__all__ = ["SharingSettings", "SharingState", "SharingAlgorithm", "RESIDUAL_KEY", "THRESHOLD_KEY", "WORLD_KEY",
           "restore_residual", "check_max_staleness"]

log = logging.getLogger(__name__)

#: ``extra_state`` keys: ``RESIDUAL_KEY.format(rank=r)`` per rank, the averaged threshold state, the world size.
RESIDUAL_KEY = "sharing.residual.{rank}"
THRESHOLD_KEY = "sharing.threshold_state"
WORLD_KEY = "sharing.world_size"

_INACTIVE = b"\x00"
_ACTIVE = b"\x01"
# How long a failing worker waits for its in-flight exchange before leaving (peers still alive finish it at once).
_DRAIN_S = 10.0
#: steps between two computations of the parameters' norm for the divergence check on the direct path
PARAM_NORM_EVERY = 16


@dataclass(frozen=True)
class SharingSettings:
    """The knobs of the gradient-sharing loop (validated by the master that builds them).

    Args:
        encoder: threshold policy, residual post-processor, shake-up frequency (see
            :class:`~torchspark.encoding.EncoderConfig`).
        overlap: exchange step ``t`` in the background while step ``t+1`` computes (staleness one step). False
            gives the synchronous loop: no staleness, but computation waits for every exchange.
        on_divergence: ``"fail"`` (raise TrainingError when an update is not finite or explodes, see
            :mod:`torchspark.nn.divergence`) or ``"warn"`` (log it once, keep training, the driver warns).
        topology: how messages travel: ``"all_gather"`` (every worker receives and decodes every message),
            ``"sharded"`` (reduce-scatter by index shards then all-gather of the sums, see
            :mod:`torchspark.training.algorithms.sharing.sharded`; receive bytes ~ ``min(N*m, dense)`` instead of ``N*m``,
            decode work / N, one more round trip) or ``"auto"`` (sharded above ``shard_above_workers`` workers).
            Both give bit-identical results.
        shard_above_workers: ``"auto"`` shards when the number of workers is larger than this.
        max_staleness: None (default): the synchronous exchange above. An integer ``k >= 0``: bounded-staleness
            asynchronous sharing, where a worker applies its peers' messages as they arrive and waits only when it
            is more than ``k`` steps ahead of its slowest peer (:mod:`torchspark.training.algorithms.sharing.stale`; needs
            ``overlap=True``).
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    overlap: bool = True
    on_divergence: str = "fail"
    topology: str = "auto"
    shard_above_workers: int = DEFAULT_SHARD_ABOVE_WORKERS
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.encoder, EncoderConfig):
            raise ConfigError(f"encoder must be an EncoderConfig, got {type(self.encoder).__name__}; build it with "
                              "EncoderConfig(...) or SharingSettings.from_dict")
        if not isinstance(self.overlap, bool):
            raise ConfigError(f"overlap must be True or False, got {self.overlap!r}")
        check_on_divergence("SharingSettings", self.on_divergence)
        check_max_staleness("SharingSettings", self.max_staleness, self.overlap)
        check_topology("SharingSettings", self.topology, self.shard_above_workers)
        if self.max_staleness is not None and self.topology == "sharded":
            raise ConfigError("SharingSettings: topology='sharded' is an exchange of the synchronous loop and "
                              f"max_staleness={self.max_staleness} the asynchronous mode (its own transport); use "
                              "topology='auto' or 'all_gather' with max_staleness, or max_staleness=None")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"encoder": EncoderConfig.to_dict(), "overlap": bool, "on_divergence": str,
        "max_staleness": int | None, "topology": str, "shard_above_workers": int}``."""
        return {"encoder": self.encoder.to_dict(), "overlap": self.overlap, "on_divergence": self.on_divergence,
                "max_staleness": self.max_staleness, "topology": self.topology,
                "shard_above_workers": self.shard_above_workers}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SharingSettings:
        encoder = data.get("encoder")
        config = EncoderConfig() if encoder is None else (
            encoder if isinstance(encoder, EncoderConfig) else EncoderConfig.from_dict(encoder))
        return cls(encoder=config, overlap=data.get("overlap", True), on_divergence=data.get("on_divergence", "fail"),
                   max_staleness=data.get("max_staleness"), topology=data.get("topology", "auto"),
                   shard_above_workers=data.get("shard_above_workers", DEFAULT_SHARD_ABOVE_WORKERS))


def check_max_staleness(owner: str, value: Any, overlap: bool) -> None:
    """``max_staleness`` is None or an integer >= 0, and asks for ``overlap=True`` (ConfigError naming the value)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{owner}: max_staleness must be None (synchronous sharing) or an integer >= 0 (steps a "
                          f"worker may run ahead of its slowest peer), got {value!r}")
    if overlap is False:
        raise ConfigError(f"{owner}: max_staleness={value} is the asynchronous mode and overlap=False the "
                          "synchronous loop without staleness; set one of them (max_staleness=0 waits for every "
                          "peer's previous step)")


@dataclass
class SharingState:
    """One worker's gradient-sharing state for a fit (mutable: replaced encoder states are stored back here).

    Attributes:
        encoder: residual + threshold state.
        bytes_sent: payload bytes this worker handed to the exchange (flag byte included) in this fit.
        dense_bytes: what dense float32 exchange of the same updates would have sent (``4 * num_params`` each).
        steps: updates encoded in this fit.
        start_threshold: the threshold the fit started from (calibrated, restored or configured; None until known).
        pending_payload: a payload encoded but not yet exchanged when a checkpoint was taken (``overlap=True``);
            set by :meth:`SharingAlgorithm.restore`, exchanged first by the next epoch.
        divergence: the first divergence message of this fit on this worker (``on_divergence="warn"``), or None.
        step_buffers: ``(before, update)``, two parameter-sized buffers reused by every step (see
            :func:`_step_into_residual`); None until the first step.
        param_norm: the parameters' norm for the divergence check, refreshed every :data:`PARAM_NORM_EVERY` steps
            of the direct path (None until the first).
        overlap_via: how the last epoch overlapped its exchange (``extra_config["sharing.overlap_via"]``):
            ``"shared_memory"`` (every worker on one host: posted gathers, no exchange thread), ``"thread"`` (the
            exchange thread) or ``"off"`` (``overlap=False``).
    """

    encoder: EncoderState
    bytes_sent: int = 0
    dense_bytes: int = 0
    steps: int = 0
    start_threshold: float | None = None
    pending_payload: bytes | None = None
    divergence: str | None = None
    #: the bounded-staleness loop's counters (:class:`~torchspark.training.algorithms.sharing.stale.StaleStats`), else None
    staleness: Any = None
    step_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    param_norm: float | None = None
    #: how the last epoch overlapped its exchange: "shared_memory" (posted gathers), "thread" or "off"
    overlap_via: str | None = None


@dataclass(frozen=True)
class _Round:
    """The outcome of one exchange: how many workers were active and the decoded sum (None: nothing sent).

    ``indices`` None: ``total`` is the dense sum (N,). Otherwise ``total`` holds the sum at these int64 indices only
    (ascending, unique; zero elsewhere), as :func:`_exchange_sparse` returns it.
    """

    active: int
    total: torch.Tensor | None
    indices: torch.Tensor | None = None


def restore_residual(extra_state: dict[str, torch.Tensor], rank: int, world_size: int, length: int,
                     device: torch.device | str) -> torch.Tensor:
    """This rank's starting residual from a previous fit's ``extra_state`` (zeros when there is none).

    Same world size as saved: rank ``r`` gets ``sharing.residual.<r>``. Different world size: rank 0 gets the sum of
    all saved residuals and the others zeros, so the total unsent update mass is preserved (it is what the whole
    group still owes the parameters, whoever sends it).

    Raises:
        TrainingError: a saved residual does not have ``length`` elements (the state belongs to another model).
    """
    residual = torch.zeros(length, dtype=torch.float32, device=device)
    if WORLD_KEY not in extra_state:
        return residual
    saved_world = int(extra_state[WORLD_KEY].reshape(-1)[0])
    saved = [extra_state[k] for k in (RESIDUAL_KEY.format(rank=r) for r in range(saved_world)) if k in extra_state]
    for t in saved:
        if t.numel() != length:
            raise TrainingError(f"a saved gradient-sharing residual has {t.numel()} elements but the network has "
                                f"{length} parameters; remove the 'sharing.*' entries from net.extra_state")
    with torch.no_grad():
        if saved_world == world_size:
            key = RESIDUAL_KEY.format(rank=rank)
            if key in extra_state:
                residual.copy_(extra_state[key].reshape(-1).to(device, torch.float32))
        elif rank == 0:
            for t in saved:
                residual.add_(t.reshape(-1).to(device, torch.float32))
    return residual


@dataclass(frozen=True)
class SharingAlgorithm:
    """Threshold-encoded gradient sharing (see the module docstring for the steps and the staleness)."""

    settings: SharingSettings

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SharingAlgorithm:
        return cls(SharingSettings.from_dict(settings))

    def to_dict(self) -> dict[str, Any]:
        return self.settings.to_dict()

    # ------------------------------------------------------------------ start
    def start(self, net: Network, comm: Communicator) -> SharingState:
        """Per-fit state: the residual and threshold state of a previous fit when ``net.extra_state`` has them.

        The threshold state is the averaged one of the previous fit, except with :class:`FixedThreshold` (stateless:
        the configured value wins) or when that fit never calibrated one (then the policy's initial state, calibrated
        in the first epoch for a calibrated start). Residuals: see :func:`restore_residual`.
        """
        config = self.settings.encoder
        residual = restore_residual(net.extra_state, comm.rank, comm.world_size, net.num_params(), net.device)
        threshold_state = None
        if THRESHOLD_KEY in net.extra_state and not isinstance(config.threshold_policy, FixedThreshold):
            # the threshold carries over; the sparsity does not, so "no sparsity" means "not stepped in this fit"
            # and the end-of-fit average skips a worker that got no data (average_states)
            threshold_state = ThresholdState(ThresholdState.from_tensor(net.extra_state[THRESHOLD_KEY].cpu()).threshold)
        if threshold_state is None or not threshold_state.calibrated:  # nothing saved, or saved before calibrating
            threshold_state = config.threshold_policy.initial_state()
        return SharingState(EncoderState(config, residual, threshold_state), start_threshold=threshold_state.threshold)

    # ------------------------------------------------------------------ epoch
    def epoch(self, state: SharingState, net: Network, batches: Iterable[Batch], comm: Communicator,
              hooks: WorkerHooks, epoch: int) -> EpochOutcome:
        """One pass over this worker's batches; returns when every worker's data ran out."""
        if self.settings.max_staleness is not None:  # the asynchronous loop has its own module
            from torchspark.training.algorithms.sharing.stale import stale_epoch
            return stale_epoch(self, state, net, batches, comm, hooks, epoch)
        out = EpochOutcome()
        it = iter(batches)
        exhausted = False
        rec = hooks.recorder
        n = net.num_params()
        transport, finish = _exchange_phases(self.settings, comm.world_size, n, net.device)
        posted = _posted_gathers(self.settings, comm)
        executor = ThreadPoolExecutor(1, thread_name_prefix="torchspark-sharing-exchange") \
            if self.settings.overlap and posted is None else None
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
                calibrate = out.rounds == 0 and not state.encoder.threshold_state.calibrated
                if batch is None:
                    if calibrate:
                        _calibrate(state, None, comm)
                    payload = _INACTIVE
                else:
                    payload = self._compute_and_encode(state, net, batch, out, hooks, comm, epoch, calibrate)
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
                        hooks.checkpoint(out, *self._cut_state(state, payload))
                    pending = _send(posted, executor, transport, comm, payload)
                    done = False
                state.bytes_sent += len(payload)
                out.rounds += 1
                if done:
                    break
                if not overlap and hooks.checkpoint is not None:  # the cut: this step applied everywhere
                    hooks.checkpoint(out, *self._cut_state(state, None))
            if posted is not None:  # every round collected on every rank: release the segment's halves
                posted.close()
        finally:
            if executor is not None:
                _shutdown(executor, pending if isinstance(pending, Future) else None)
        if hooks.progress is not None and out.iterations % hooks.progress_every:  # the epoch's last count
            hooks.progress(ProgressUpdate(comm.rank, epoch, out.iterations, out.examples, out.last_score))
        if hooks.report_score is not None:
            _report_epoch_score(out, net, comm, hooks, epoch)
        return out

    def _compute_and_encode(self, state: SharingState, net: Network, batch: Batch, out: EpochOutcome,
                            hooks: WorkerHooks, comm: Communicator, epoch: int, calibrate: bool) -> bytes:
        rec = hooks.recorder
        rank = comm.rank
        step = net.iteration
        validate = epoch == 0 and out.iterations == 0
        with rec.phase("fit", examples=len(batch)):
            if calibrate or not _can_fuse(state, net):
                update = net.compute_update(batch, validate=validate)
                self._check_divergence(state, net, update, step)
                if calibrate:
                    _calibrate(state, update, comm)
                message, state.encoder = encode_step(update, state.encoder, step)
            else:  # the same steps, the update moved into the residual while the parameters are restored
                self._report_divergence(state, net, *_step_into_residual(state, net, batch, validate), step)
                message, state.encoder = encode_step(None, state.encoder, step)
        payload = _ACTIVE if message.format == "empty" else _ACTIVE + to_bytes(message)
        dense = 4 * net.num_params()
        state.dense_bytes += dense
        state.steps += 1
        rec.record_encoding(step, len(payload), dense, message.density, message.threshold, message.format)
        out.iterations += 1
        out.examples += len(batch)
        out.last_score = net.last_score
        out.score_sum += net.last_score * len(batch)
        rec.record_score(net.iteration, net.last_score)
        if hooks.progress is not None and out.iterations % hooks.progress_every == 0:
            hooks.progress(ProgressUpdate(rank, epoch, out.iterations, out.examples, net.last_score,
                                           state.bytes_sent + len(payload), state.dense_bytes))
        return payload

    # ------------------------------------------------------------------ checkpoints
    def rank_state(self, state: SharingState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's part of a checkpoint: its residual and threshold state (tensors), its traffic counters."""
        return self._cut_state(state, None)

    def _cut_state(self, state: SharingState, pending: bytes | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {"residual": state.encoder.residual, "threshold_state": state.encoder.threshold_state.to_tensor()}
        if pending is not None:
            tensors["pending"] = torch.frombuffer(bytearray(pending), dtype=torch.uint8)
        record = {"bytes_sent": state.bytes_sent, "dense_bytes": state.dense_bytes, "steps": state.steps,
                  "start_threshold": state.start_threshold}
        return tensors, record

    def restore(self, state: SharingState, net: Network, tensors: dict[str, torch.Tensor],
                record: dict[str, Any]) -> None:
        """Inverse of :meth:`rank_state` (and of a cut's state with its pending payload)."""
        with torch.no_grad():
            state.encoder.residual.copy_(tensors["residual"].reshape(-1).to(state.encoder.residual.device))
        state.encoder = replace(state.encoder, threshold_state=ThresholdState.from_tensor(tensors["threshold_state"]))
        state.bytes_sent = int(record.get("bytes_sent", 0))
        state.dense_bytes = int(record.get("dense_bytes", 0))
        state.steps = int(record.get("steps", 0))
        state.start_threshold = record.get("start_threshold")
        pending = tensors.get("pending")
        state.pending_payload = bytes(pending.numpy().tobytes()) if pending is not None else None

    def _check_divergence(self, state: SharingState, net: Network, update: torch.Tensor, step: int) -> None:
        """Divergence never passes silently: raise, or (``on_divergence="warn"``) log once and remember it."""
        self._report_divergence(state, net, float(update.norm()), float(net.params_view().norm()), step)

    def _report_divergence(self, state: SharingState, net: Network, update_norm: float, param_norm: float,
                           step: int) -> None:
        message = update_divergence(update_norm, param_norm, net.last_score, step, net.updater)
        if message is None or state.divergence is not None:
            return
        if self.settings.on_divergence == "fail":
            raise TrainingError(f"{message} (on_divergence='warn' only warns)")
        state.divergence = message
        log.warning("gradient sharing: %s Training goes on (on_divergence='warn').", message)

    # ------------------------------------------------------------------ finish
    def finish(self, state: SharingState, net: Network, comm: Communicator
               ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """End of fit: average updater state, module buffers and threshold state, verify the replicas, hand back
        what must persist.

        Returns:
            ``extra_state``: this rank's residual (``sharing.residual.<rank>``), the averaged threshold state and the
            world size; ``extra_config``: world size, ``replicas_identical``, the fit's summed ``bytes_sent`` /
            ``dense_bytes`` over all workers, the averaged end ``threshold``, the ``start_threshold`` (calibrated or
            configured), ``divergence`` (the first worker's divergence message with ``on_divergence="warn"``, else
            None) and ``replica_sha256`` (hex SHA-256 of every replica's float32 parameters followed by its
            averaged buffers, equal on all ranks); all ranks return the same config, the driver keeps rank 0's.

        Raises:
            TrainingError: the replicas' parameters differ (a worker applied a different message sequence), or their
                averaged buffers do (the communicator returned different sums).
        """
        world = comm.world_size
        stale: dict[str, Any] = {}
        if self.settings.max_staleness is not None:  # 0. the replicas drifted apart: average their parameters
            from torchspark.training.algorithms.sharing.stale import reconcile
            stale = reconcile(state, net, comm, self.settings.max_staleness)
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
        summary = torch.tensor([*state_summands(state.encoder.threshold_state), float(state.bytes_sent),
                                float(state.dense_bytes)], dtype=torch.float64, device=net.device)
        comm.all_reduce_sum(summary)
        totals = [float(v) for v in summary.cpu()]
        averaged = average_from_sums(totals[:NUM_SUMMANDS], world)
        bytes_sent, dense_bytes = totals[NUM_SUMMANDS:]
        # 3. the replicas must be bit-identical: the parameters, and the buffers just averaged (all-reduce results
        # are identical on every rank, so a difference there means a broken transport; empty without buffers)
        digest = hashlib.sha256(net.params().cpu().numpy().tobytes())
        digest.update(net.buffers().cpu().numpy().tobytes())
        digests = comm.all_gather_bytes(digest.digest())
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        if differing:
            raise TrainingError(f"gradient-sharing replicas diverged: the parameters or averaged buffers of worker(s) "
                                f"{differing} differ from worker 0's after the fit; every worker must apply the same "
                                "messages (check that all workers run the same torchspark/torch versions and devices)")
        # 4. divergence a worker only warned about (on_divergence="warn"): every rank learns the first one
        warned = [d.decode() for d in comm.all_gather_bytes((state.divergence or "").encode()) if d]
        extra_state = {
            RESIDUAL_KEY.format(rank=comm.rank): state.encoder.residual.detach().cpu().clone(),
            THRESHOLD_KEY: averaged.to_tensor(),
            WORLD_KEY: torch.tensor([world], dtype=torch.int64),
        }
        extra_config = {
            "sharing.world_size": world,
            "sharing.replicas_identical": not differing,  # measured above (the raise keeps it True)
            "sharing.bytes_sent": int(bytes_sent),
            "sharing.dense_bytes": int(dense_bytes),
            "sharing.threshold": averaged.threshold,
            "sharing.start_threshold": state.start_threshold,
            "sharing.replica_sha256": digests[0].hex(),
            "sharing.divergence": warned[0] if warned else None,
            **stale,
        }
        if self.settings.max_staleness is None:  # the synchronous loop's exchange (the async mode has its own)
            extra_config["sharing.topology"] = _topology(self.settings, world)
            extra_config["sharing.overlap_via"] = state.overlap_via
        return extra_state, extra_config


def _calibrate(state: SharingState, update: torch.Tensor | None, comm: Communicator) -> None:
    """Agree on the calibrated start threshold: gather every worker's value (NaN: none), take the geometric mean."""
    local = local_calibration(update, state.encoder)
    gathered = comm.all_gather_bytes(struct.pack("<d", math.nan if local is None else local))
    agreed = agree_threshold([struct.unpack("<d", data)[0] for data in gathered])
    state.encoder = with_calibration(state.encoder, agreed)
    if agreed is not None:
        state.start_threshold = state.encoder.threshold_state.threshold
        log.info("gradient sharing: calibrated start threshold %.3g (this worker alone: %s)", agreed,
                 "no data" if local is None else f"{local:.3g}")


def _can_fuse(state: SharingState, net: Network) -> bool:
    """Whether :func:`_step_into_residual` + ``encode_step(None, ...)`` does exactly what ``compute_update`` +
    ``encode_step(update, ...)`` would: the encoder will not calibrate from this update, and float32 parameters."""
    encoder = state.encoder
    return (net.params_view().dtype == torch.float32
            and (encoder.threshold_state.calibrated or encoder.config.threshold_policy.calibration_target() is None))


def _step_into_residual(state: SharingState, net: Network, batch: Batch, validate: bool) -> tuple[float, float]:
    """Steps 1 + 2a fused. When the network can (:meth:`Network.can_step_into`) the updater steps straight into the
    residual and ``(norm(residual), norm(params))`` is returned for the divergence check; otherwise one updater
    step, then in one pass ``u = before - after``, the parameters restored and ``residual += u``
    (:func:`~torchspark.encoding.accumulate_step`, bit-identical to ``compute_update`` followed by the encoder's
    add), returning ``(norm(u), norm(params))``. Exact torch norms when one is not finite, so the message is the
    unfused path's."""
    flat = net.params_view()
    if net.can_step_into():  # the updater steps straight into the residual: no snapshot, no restore
        residual = state.encoder.residual
        net.train_step_into(residual, batch, validate)
        # the residual after the add stands in for the update's norm: it differs from it by the residual before
        # the step, which the threshold and the residual post-processor keep at a few thresholds per entry
        update_norm = math.sqrt(float(torch.dot(residual, residual)))
        # the parameters move only by the exchanged +-t steps, a tiny fraction of their norm per step: a norm up to
        # PARAM_NORM_EVERY - 1 steps old judges "the update is 1000x the parameters" the same (one pass saved)
        if state.param_norm is None or state.steps % PARAM_NORM_EVERY == 0 or not math.isfinite(state.param_norm):
            state.param_norm = math.sqrt(float(torch.dot(flat, flat)))
        param_norm = state.param_norm
        if not (math.isfinite(update_norm) and math.isfinite(param_norm)):
            update_norm, param_norm = float(residual.norm()), float(flat.norm())
        return update_norm, param_norm
    if state.step_buffers is None:
        state.step_buffers = (torch.empty_like(flat), torch.empty_like(flat))
    before, update = state.step_buffers
    with torch.no_grad():
        before.copy_(flat)
    net.train_step(batch, validate)
    update_norm, param_norm = accumulate_step(state.encoder.residual, before, flat, update)
    if not (math.isfinite(update_norm) and math.isfinite(param_norm)):
        update_norm, param_norm = float(update.norm()), float(before.norm())
    return update_norm, param_norm


def _report_epoch_score(out: EpochOutcome, net: Network, comm: Communicator, hooks: WorkerHooks, epoch: int) -> None:
    """The epoch's example-weighted mean loss over all workers (one all-reduce every rank joins); rank 0 reports."""
    totals = torch.tensor([out.score_sum, float(out.examples)], dtype=torch.float64, device=net.device)
    comm.all_reduce_sum(totals)
    score_sum, examples = (float(v) for v in totals.cpu())
    if comm.rank == 0 and examples > 0 and hooks.report_score is not None:
        hooks.report_score(ScoreReport(epoch, None, int(examples), score_sum / examples))


def _exchange(comm: Communicator, payload: bytes, length: int, device: torch.device | str) -> _Round:
    """Steps 3 + 4a: gather every worker's payload and decode the messages, in rank order, into one dense sum."""
    active, messages = _gather_messages(comm, payload, length)
    return _Round(active, _dense_sum(messages, length, device))


def _exchange_sparse(comm: Communicator, payload: bytes, length: int, device: torch.device | str) -> _Round:
    """:func:`_exchange` for the training loop: when every message of the round is sparse (or empty) and the
    parameters live on the CPU, the sum is kept at the union of the messages' indices only (``_Round.indices``), so
    no parameter-sized buffer is zeroed, decoded into and subtracted; same values, same order of additions."""
    return _round_from_gathered(comm.all_gather_bytes(payload), length, device)


def _round_from_gathered(gathered: list[bytes], length: int, device: torch.device | str) -> _Round:
    """The second half of :func:`_exchange_sparse`: parse the gathered payloads and sum them."""
    if torch.device(device).type == "cpu":
        fast = _sparse_round(gathered, length)
        if fast is not None:
            return fast
    active, messages = _parse_gathered(gathered, length)
    if torch.device(device).type != "cpu" or any(m.format == "bitmap" for m in messages):
        return _Round(active, _dense_sum(messages, length, device))
    sparse = [m for m in messages if m.format == "sparse"]
    if not sparse:
        return _Round(active, None)
    indices, total = sparse_decode_sum(sparse)
    return _Round(active, total, indices)


def _sparse_round(gathered: list[bytes], length: int) -> _Round | None:
    """:func:`_round_from_gathered` for the usual round, where every message is sparse or empty: the entries are
    read in place (:func:`~torchspark.encoding.wire.sparse_view`, the same checks as ``from_bytes``) and summed
    without building message objects; the same indices and sums. None when some message is a bitmap."""
    active = 0
    arrays: list[Any] = []
    thresholds: list[float] = []
    for rank, data in enumerate(gathered):
        flag = data[:1]
        if flag not in (_ACTIVE, _INACTIVE) or (flag == _INACTIVE and len(data) > 1):
            return None  # _parse_gathered raises the error
        active += flag == _ACTIVE
        if len(data) == 1:
            continue
        view = sparse_view(memoryview(data)[1:])
        if view is None:
            return None
        if view[0] != length:
            raise EncodingError(f"worker {rank} sent an update of {view[0]} elements but this network has "
                                f"{length} parameters; all workers must train the same network")
        if view[2].shape[0]:
            arrays.append(view[2])
            thresholds.append(view[1])
    if not arrays:
        return _Round(active, None)
    indices, total = sparse_sum_entries(arrays, thresholds)
    return _Round(active, torch.from_numpy(total), torch.from_numpy(indices))


def _gather_messages(comm: Communicator, payload: bytes, length: int) -> tuple[int, list[EncodedUpdate]]:
    """Step 3: all-gather the payloads; returns the number of active workers and their messages in rank order."""
    return _parse_gathered(comm.all_gather_bytes(payload), length)


def _parse_gathered(gathered: list[bytes], length: int) -> tuple[int, list[EncodedUpdate]]:
    """The gathered payloads as (active workers, their messages in rank order); EncodingError for a bad one."""
    active = 0
    messages = []
    for rank, data in enumerate(gathered):
        flag, body = data[:1], data[1:]
        if flag not in (_ACTIVE, _INACTIVE) or (flag == _INACTIVE and body):
            raise EncodingError(f"worker {rank} sent a malformed gradient-sharing payload (flag {flag!r}, "
                                f"{len(body)} body bytes); all workers must run the same torchspark version")
        active += flag == _ACTIVE
        if not body:
            continue
        message = from_bytes(body)
        if message.length != length:
            raise EncodingError(f"worker {rank} sent an update of {message.length} elements but this network has "
                                f"{length} parameters; all workers must train the same network")
        messages.append(message)
    return active, messages


def _dense_sum(messages: list[EncodedUpdate], length: int, device: torch.device | str) -> torch.Tensor | None:
    """Step 4a: decode the messages in rank order into one zeroed buffer (None when there is no message)."""
    if not messages:
        return None
    total = torch.zeros(length, dtype=torch.float32, device=device)
    for message in messages:
        decode(message, total)
    return total


def _topology(settings: SharingSettings, world_size: int) -> str:
    return resolve_topology(settings.topology, settings.shard_above_workers, world_size)


def _exchange_function(settings: SharingSettings, world_size: int) -> Any:
    """The exchange of this fit's topology (the same on every rank: it depends on the world size only)."""
    if _topology(settings, world_size) == "sharded":
        from torchspark.training.algorithms.sharing.sharded import sharded_exchange  # imports this module
        return sharded_exchange
    return _exchange_sparse  # the dense _exchange is its reference (same parameters after _apply)


def _exchange_phases(settings: SharingSettings, world_size: int, length: int, device: torch.device | str
                     ) -> tuple[Callable[[Communicator, bytes], Any], Callable[[Any], _Round]]:
    """This fit's exchange as ``(transport, finish)``: ``finish(transport(comm, payload))`` is
    :func:`_exchange_function`'s exchange. With ``overlap`` the transport runs on the exchange thread and ``finish``
    on the training thread. For all-gather the transport is the all-gather alone (the thread only waits on the
    wire, where it does not hold the GIL) and the parsing, summing and applying run on the training thread between
    steps, instead of competing with it for the GIL: +11% samples/s for the MLP benchmark's sharing on 2 workers
    (6 paired runs). The sharded exchange interleaves its decoding with two collectives, so it runs whole on the
    thread."""
    if _topology(settings, world_size) == "sharded":
        exchange = _exchange_function(settings, world_size)
        return (lambda comm, payload: exchange(comm, payload, length, device)), (lambda result: result)
    return (lambda comm, payload: comm.all_gather_bytes(payload)), \
        (lambda gathered: _round_from_gathered(gathered, length, device))


class _Posted:
    """A round posted through :class:`~torchspark.training.comm.shm.PostedGathers`: ``result()`` collects it (the
    gathered payloads, as the exchange thread's future would return them)."""

    __slots__ = ("_gathers",)

    def __init__(self, gathers: PostedGathers) -> None:
        self._gathers = gathers

    def result(self) -> list[bytes]:
        return self._gathers.collect()


def _posted_gathers(settings: SharingSettings, comm: Communicator) -> PostedGathers | None:
    """Split-phase gathers for this epoch's overlapped all-gather when the communicator has them (every rank on
    one host, FIFO barriers): the training thread posts its payload and collects the round after computing the
    next step, with no exchange thread. The same decision on every rank (collective)."""
    opener = getattr(comm, "posted_gathers", None)
    if not settings.overlap or opener is None or _topology(settings, comm.world_size) != "all_gather":
        return None
    return opener()


def _send(posted: PostedGathers | None, executor: ThreadPoolExecutor | None,
          transport: Callable[[Communicator, bytes], Any], comm: Communicator, payload: bytes) -> Future[Any] | _Posted:
    """Start exchanging ``payload``: post it (split-phase gathers) or hand it to the exchange thread."""
    if posted is not None:
        posted.post(payload)
        return _Posted(posted)
    assert executor is not None
    return executor.submit(transport, comm, payload)


def _apply(net: Network, result: _Round) -> bool:
    """Step 4b: ``params -= S_t``. Returns True when no worker was active (the epoch is over everywhere)."""
    if result.total is not None:
        if result.indices is not None:
            net.apply_update_at(result.indices, result.total)
        else:
            net.apply_update(result.total)
    return result.active == 0


def _shutdown(executor: ThreadPoolExecutor, pending: Future[_Round] | None) -> None:
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
