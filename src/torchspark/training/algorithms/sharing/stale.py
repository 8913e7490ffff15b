"""Bounded-staleness gradient sharing (``max_staleness=k``): `StaleSharingAlgorithm`, mode
``"stale_sharing"``.

Asynchronous SGD with a bound on how far ahead a worker may run. Per minibatch ``t`` of an epoch, on every worker:
(1) wait until every peer's messages of steps ``<= t-k-1`` of this epoch are applied (a peer that sent its
end-of-epoch marker with fewer messages only owes those), applying whatever already arrived; (2) compute and
encode the update exactly as the synchronous loop does (`step`);
(3) apply its own message at once and post it to every peer without waiting
(`torchspark.training.comm.mailbox`). Every arrival is checked by a
`PeerLedger` (no message lost or applied twice). At the end
of the fit the replicas, which drifted apart by the messages in flight, are averaged (`reconcile`), then the
fit ends as the synchronous one does. The design (why, termination, what is not supported) is in docs/design.md,
"Bounded staleness".

Example::

    algo = StaleSharingAlgorithm(SharingSettings(EncoderConfig(), max_staleness=2))
    state = algo.start(net, comm)
    algo.epoch(state, net, batches, comm, WorkerHooks(), 0)
    extra_state, extra_config = algo.finish(state, net, comm)   # extra_config["sharing.max_lag_steps"] <= 2
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from torchspark.data import Trainable
from torchspark.encoding import decode, from_bytes
from torchspark.errors import ConfigError, EncodingError, TrainingError, WaitTimeout
from torchspark.nn import Network
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.algorithms.sharing.collectives import calibrate, report_epoch_score
from torchspark.training.algorithms.sharing.finish import finish_fit
from torchspark.training.algorithms.sharing.ledger import PeerLedger, StaleStats
from torchspark.training.algorithms.sharing.rounds import ACTIVE
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.algorithms.sharing.state import (
    SharingAlgorithmBase,
    SharingState,
)
from torchspark.training.algorithms.sharing.step import compute_and_encode
from torchspark.training.comm import Communicator
from torchspark.training.comm.mailbox import END, MESSAGE, Envelope, Mailbox, open_mailbox
from torchspark.training.hooks import ProgressUpdate, WorkerHooks
from torchspark.training.waiting import Deadline

__all__ = ["StaleSharingAlgorithm", "stale_epoch", "reconcile"]


@dataclass(frozen=True)
class StaleSharingAlgorithm(SharingAlgorithmBase):
    """Bounded-staleness gradient sharing (mode ``"stale_sharing"``; see the module docstring).

    Raises:
        ConfigError: ``settings.max_staleness`` is None: that is the synchronous ``"sharing"`` algorithm.
    """

    def __post_init__(self) -> None:
        if self.settings.max_staleness is None:
            raise ConfigError(
                "StaleSharingAlgorithm needs max_staleness=k (an integer >= 0); with "
                "max_staleness=None use the synchronous 'sharing' algorithm (SharingAlgorithm)"
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
        """One pass over this worker's batches (`stale_epoch`)."""
        return stale_epoch(self.settings, state, net, batches, comm, hooks, epoch)

    def finish(
        self, state: SharingState, net: Network, comm: Communicator
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """End of fit: `reconcile` (the replicas averaged), then
        `finish_fit`; ``extra_config`` adds the
        ``sharing.*`` entries of `reconcile`."""
        stale = reconcile(state, net, comm, int(self.settings.max_staleness))  # type: ignore[arg-type]
        extra_state, extra_config = finish_fit(state, net, comm)
        extra_config.update(stale)
        return extra_state, extra_config


def stale_epoch(
    settings: SharingSettings,
    state: SharingState,
    net: Network,
    batches: Iterable[Trainable],
    comm: Communicator,
    hooks: WorkerHooks,
    epoch: int,
) -> EpochOutcome:
    """One epoch of bounded-staleness sharing on this worker (see the module docstring); returns when this worker
    has applied every message every peer sent in the epoch. ``settings.max_staleness`` is the bound ``k``."""
    k = int(settings.max_staleness)  # type: ignore[arg-type]
    if state.staleness is None:
        state.staleness = StaleStats()
    stats: StaleStats = state.staleness
    out = EpochOutcome()
    rec = hooks.recorder
    n = net.num_params()
    ledger = PeerLedger((p for p in range(comm.world_size) if p != comm.rank), epoch)
    first = not state.encoder.threshold_state.calibrated  # calibrate on the first step (a collective)
    mailbox: Mailbox | None = None
    timeout_s = 300.0
    failed = True
    it = iter(batches)
    try:
        while True:
            with rec.phase("data_wait"):
                batch = next(it, None)
            if batch is None:
                break
            step = out.iterations
            if mailbox is not None:
                with rec.phase("exchange"):
                    _receive(mailbox, ledger, net, n, stats, timeout_s, functools.partial(ledger.owed, step, k))
            stats.lags.append(ledger.lag(step))
            payload = compute_and_encode(
                state, net, batch, out, hooks, comm, epoch, first and step == 0, settings.on_divergence
            )
            if mailbox is None:  # after the calibration collective, the only one of the epoch
                mailbox, timeout_s = open_mailbox(comm, epoch)
            body = payload[len(ACTIVE) :]
            _apply(net, [body], n, comm.rank)
            stats.applied += 1
            mailbox.post(Envelope(step, epoch, MESSAGE, body))
            stats.sent += 1
            state.bytes_sent += len(payload)
        if mailbox is None:
            if first:  # no data: still vote (NaN), as every worker joins the calibration all-gather
                calibrate(state, None, comm)
            mailbox, timeout_s = open_mailbox(comm, epoch)
        mailbox.post(Envelope(out.iterations, epoch, END))
        with rec.phase("exchange"):
            _receive(mailbox, ledger, net, n, stats, timeout_s, lambda: not ledger.complete())
        failed = False
    finally:
        if mailbox is not None:
            mailbox.close(failed)
    out.rounds = out.iterations
    if hooks.progress is not None and out.iterations % hooks.progress_every:  # the epoch's last count
        hooks.progress(ProgressUpdate(comm.rank, epoch, out.iterations, out.examples, out.last_score))
    if hooks.report_score is not None:
        report_epoch_score(out, net, comm, hooks, epoch)
    return out


def _receive(
    mailbox: Mailbox,
    ledger: PeerLedger,
    net: Network,
    n: int,
    stats: StaleStats,
    timeout_s: float,
    blocked: Callable[[], bool],
) -> None:
    """Apply every peer message that has arrived; keep waiting while ``blocked()`` (up to ``timeout_s``)."""
    deadline = Deadline.after(timeout_s)
    while True:
        bodies: list[bytes] = []
        senders = {p for p in ledger.received if p not in ledger.ended}
        while senders:  # everything already here, without blocking
            got = mailbox.receive(senders, None)
            if got is None:
                break
            if ledger.accept(*got):
                bodies.append(got[1].payload)
            else:
                senders.discard(got[0])
        if bodies:
            _apply(net, bodies, n, None)
            stats.applied += len(bodies)
        if not blocked():
            return
        senders = {p for p in ledger.received if p not in ledger.ended}
        got = mailbox.receive(senders, deadline.left())
        if got is None:
            waiting = sorted(p for p in senders)
            raise WaitTimeout(
                f"gradient sharing (max_staleness): worker(s) {waiting} sent no update within "
                f"rendezvous_timeout_s={timeout_s}; a peer is stuck or gone (raise "
                "rendezvous_timeout_s if it is merely slow)"
            )
        if ledger.accept(*got):
            _apply(net, [got[1].payload], n, None)
            stats.applied += 1


def _apply(net: Network, bodies: list[bytes], n: int, rank: int | None) -> None:
    """Decode the messages (empty bodies carry nothing) into one sum and apply ``params -= sum``."""
    total: torch.Tensor | None = None
    for body in bodies:
        if not body:
            continue
        message = from_bytes(body)
        if message.length != n:
            raise EncodingError(
                f"a peer sent an update of {message.length} elements but this network has {n} "
                "parameters; all workers must train the same network"
            )
        if total is None:
            total = torch.zeros(n, dtype=torch.float32, device=net.device)
        decode(message, total)
    if total is not None:
        net.apply_update(total)


def reconcile(state: SharingState, net: Network, comm: Communicator, max_staleness: int) -> dict[str, Any]:
    """End of fit: measure how far the replicas drifted apart, average their parameters, total the counters.

    Collective (every rank, no mailbox open). Returns the ``sharing.*`` extra_config entries of the async mode.
    """
    stats: StaleStats = state.staleness if state.staleness is not None else StaleStats()
    world = comm.world_size
    params = net.params()
    mean = params.clone()
    comm.all_reduce_sum(mean)
    mean /= world
    local_divergence = float((params - mean).abs().max()) if params.numel() else 0.0
    net.set_params(mean)
    gathered = comm.all_gather_bytes(struct.pack("<dqqq", local_divergence, stats.max_lag, stats.sent, stats.applied))
    rows = [struct.unpack("<dqqq", g) for g in gathered]
    sent = sum(r[2] for r in rows)
    applied = sum(r[3] for r in rows)
    if applied != world * sent:
        raise TrainingError(
            f"gradient sharing (max_staleness): the workers applied {applied} messages but sent "
            f"{sent} to {world} workers (expected {world * sent}); a message was lost or applied "
            "twice"
        )
    return {
        "sharing.max_staleness": max_staleness,
        "sharing.max_lag_steps": max(r[1] for r in rows),
        "sharing.replica_divergence": max(r[0] for r in rows),
        "sharing.messages_sent": sent,
        "sharing.messages_applied": applied,
    }
