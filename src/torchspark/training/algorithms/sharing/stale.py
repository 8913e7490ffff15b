"""Bounded-staleness gradient sharing (``max_staleness=k``): asynchronous SGD with a bound on how far ahead a
worker may run (the seeds' *asynchronous* gradient sharing; DL4J propagates updates without a barrier).

Per minibatch ``t`` of an epoch, on every worker:
  1. wait (phase ``exchange``) until every peer's messages of steps ``<= t-k-1`` of this epoch are applied (a peer
     that sent its end-of-epoch marker with fewer messages only owes those): a worker is never more than ``k``
     steps ahead of its slowest peer when it computes. Peers' messages that already arrived are applied too;
  2. compute and encode the update exactly as the synchronous loop does (same encoder, residual, threshold policy,
     divergence check, stats: :meth:`SharingAlgorithm._compute_and_encode`);
  3. apply its own decoded message at once and post it to every peer without waiting
     (:mod:`torchspark.training.comm.mailbox`: in-process queues, or gloo point-to-point on background threads).

With ``k = 0`` a worker computes step ``t`` only after applying every peer's step ``t-1`` (the synchronous loop's
information, without its lock-step); with larger ``k`` a slow worker stalls the others only once it is ``k`` steps
behind. Peers' messages are applied in arrival order, so during the fit the replicas differ (by the messages in
flight and by floating-point rounding); that is the price of not waiting.

No message lost or applied twice. Every message carries ``[seq, epoch, length, flags]``; ``seq`` counts a sender's
messages of the epoch from 0 and is checked on receipt (:class:`PeerLedger`): a gap (a lost message) or a repeat
raises TrainingError. End of epoch: a worker whose data ran out posts an ``END`` marker carrying its message count;
its epoch ends once it has applied every peer's messages up to that peer's marker. So every worker applies exactly
every message every worker sent (``messages_applied == world_size * messages_sent``), and unequal partitions end
without hanging: nobody waits for a step a finished peer will never send. An epoch's end is thus a
synchronisation point: step numbers (and lags) start again from 0 in the next epoch.

Stats (``hooks.recorder``): ``data_wait`` and ``fit`` (compute + encode, with ``record_encoding`` per step) as in the
synchronous loop; ``exchange`` is the time spent waiting for peers and applying their messages (own messages are
applied inside the step). Per fit, :class:`StaleStats` on the worker's state keeps every step's lag.

Calibrated start (the default threshold policies): the calibration all-gather runs before the epoch's mailbox opens
(after the first update is computed, or at once on a worker without data), as in the synchronous loop.

End of fit (:func:`reconcile`, called first by :meth:`SharingAlgorithm.finish`): the replicas are made identical
again by averaging their parameters with one all-reduce (as DL4J averages them); the largest max-abs difference
between a replica and the mean is measured before that. Then ``finish`` proceeds as in synchronous mode (updater
state, float buffers and threshold state averaged, replica checksums compared). ``extra_config`` adds
``sharing.max_staleness``, ``sharing.max_lag_steps`` (the largest number of steps any worker ran ahead of its
slowest unfinished peer when it computed an update; never more than ``k``), ``sharing.replica_divergence``,
``sharing.messages_sent`` and ``sharing.messages_applied`` (totals over workers).

Not supported with ``max_staleness`` (ConfigError when the master is built): ``overlap=False`` (the synchronous
loop), ``checkpoint_directory`` (a cut would need every in-flight message), ``topology="sharded"`` (a collective
topology); and GPU workers on nccl (the mailbox is gloo-only: ConfigError when the epoch starts). Every wait carries
the communicator's timeout (``rendezvous_timeout_s``); only the mailbox threads talk during an epoch, and
collectives (calibration, epoch score, finish) run only while no mailbox is open.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import torch

from torchspark.data import Batch
from torchspark.encoding import decode, from_bytes
from torchspark.errors import EncodingError, TrainingError, WaitTimeout
from torchspark.nn import Network
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.comm import Communicator
from torchspark.training.comm.mailbox import END, MESSAGE, Envelope, Mailbox, open_mailbox
from torchspark.training.hooks import ProgressUpdate, WorkerHooks

if TYPE_CHECKING:
    from torchspark.training.algorithms.sharing.loop import SharingAlgorithm, SharingState

__all__ = ["StaleStats", "PeerLedger", "stale_epoch", "reconcile"]


@dataclass
class StaleStats:
    """One worker's counters over a fit.

    Attributes:
        lags: per computed update, how many steps this worker was ahead of its slowest unfinished peer.
        sent: messages this worker posted (one per update; also applied here at once).
        applied: messages applied on this worker (its own and its peers').
    """

    lags: list[int] = field(default_factory=list)
    sent: int = 0
    applied: int = 0

    @property
    def max_lag(self) -> int:
        return max(self.lags, default=0)


class PeerLedger:
    """What this worker received from its peers in one epoch; rejects lost, repeated or foreign messages.

    ``received[p]`` counts ``p``'s messages taken in (and applied, see :func:`stale_epoch`), ``ended[p]`` is the
    count ``p``'s END marker announced.
    """

    def __init__(self, peers: Iterable[int], epoch: int) -> None:
        self.epoch = epoch
        self.received = {p: 0 for p in peers}
        self.ended: dict[int, int] = {}

    def accept(self, sender: int, env: Envelope) -> bool:
        """Check ``env`` from ``sender``; True when it is an update message to apply, False for its END marker.

        Raises:
            TrainingError: the message belongs to another epoch, its ``seq`` skips one (a message was lost) or
                repeats one (it would be applied twice), or the marker's count disagrees with what arrived.
        """
        if sender not in self.received or sender in self.ended:
            raise TrainingError(f"gradient sharing: unexpected message from worker {sender} (epoch {self.epoch}, "
                                f"{'after its end marker' if sender in self.ended else 'not a peer'})")
        if env.epoch != self.epoch:
            raise TrainingError(f"gradient sharing: worker {sender} sent a message of epoch {env.epoch} while this "
                                f"worker is in epoch {self.epoch}; all workers must run the same torchspark version")
        expected = self.received[sender]
        if env.seq != expected:
            what = "lost (a gap)" if env.seq > expected else "repeated (a duplicate)"
            raise TrainingError(f"gradient sharing: message {expected} of worker {sender} in epoch {self.epoch} was "
                                f"{what}: received seq {env.seq}; no message may be lost or applied twice")
        if env.flags == END:
            self.ended[sender] = env.seq
            return False
        if env.flags != MESSAGE:
            raise TrainingError(f"gradient sharing: worker {sender} sent unknown flags {env.flags}")
        self.received[sender] = expected + 1
        return True

    def owed(self, step: int, k: int) -> bool:
        """Whether some peer's message of a step ``<= step-k-1`` is not applied yet."""
        return any(n < min(step - k, self.ended.get(p, math.inf)) for p, n in self.received.items())

    def lag(self, step: int) -> int:
        """Steps this worker (about to compute ``step``) is ahead of its slowest peer that has not finished."""
        running = [n for p, n in self.received.items() if p not in self.ended]
        return max(0, step - min(running)) if running else 0

    def complete(self) -> bool:
        return len(self.ended) == len(self.received)


def stale_epoch(algo: "SharingAlgorithm", state: "SharingState", net: Network, batches: Iterable[Batch],
                comm: Communicator, hooks: WorkerHooks, epoch: int) -> EpochOutcome:
    """One epoch of bounded-staleness sharing on this worker (see the module docstring)."""
    from torchspark.training.algorithms.sharing.loop import _ACTIVE, _calibrate, _report_epoch_score

    k = int(algo.settings.max_staleness)  # type: ignore[arg-type]
    if state.staleness is None:
        state.staleness = StaleStats()
    stats: StaleStats = state.staleness
    out = EpochOutcome()
    rec = hooks.recorder
    n = net.num_params()
    ledger = PeerLedger((p for p in range(comm.world_size) if p != comm.rank), epoch)
    calibrate = not state.encoder.threshold_state.calibrated
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
                    _receive(mailbox, ledger, net, n, stats, timeout_s, lambda: ledger.owed(step, k))
            stats.lags.append(ledger.lag(step))
            payload = algo._compute_and_encode(state, net, batch, out, hooks, comm, epoch, calibrate and step == 0)
            if mailbox is None:  # after the calibration collective, the only one of the epoch
                mailbox, timeout_s = open_mailbox(comm, epoch)
            body = payload[len(_ACTIVE):]
            _apply(net, [body], n, comm.rank)
            stats.applied += 1
            mailbox.post(Envelope(step, epoch, MESSAGE, body))
            stats.sent += 1
            state.bytes_sent += len(payload)
        if mailbox is None:
            if calibrate:  # no data: still vote (NaN), as every worker joins the calibration all-gather
                _calibrate(state, None, comm)
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
        _report_epoch_score(out, net, comm, hooks, epoch)
    return out


def _receive(mailbox: Mailbox, ledger: PeerLedger, net: Network, n: int, stats: StaleStats, timeout_s: float,
             blocked: Any) -> None:
    """Apply every peer message that has arrived; keep waiting while ``blocked()`` (up to ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
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
        got = mailbox.receive(senders, max(0.0, deadline - time.monotonic()))
        if got is None:
            waiting = sorted(p for p in senders)
            raise WaitTimeout(f"gradient sharing (max_staleness): worker(s) {waiting} sent no update within "
                              f"rendezvous_timeout_s={timeout_s}; a peer is stuck or gone (raise "
                              "rendezvous_timeout_s if it is merely slow)")
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
            raise EncodingError(f"a peer sent an update of {message.length} elements but this network has {n} "
                                "parameters; all workers must train the same network")
        if total is None:
            total = torch.zeros(n, dtype=torch.float32, device=net.device)
        decode(message, total)
    if total is not None:
        net.apply_update(total)


def reconcile(state: "SharingState", net: Network, comm: Communicator, max_staleness: int) -> dict[str, Any]:
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
    gathered = comm.all_gather_bytes(struct.pack("<dqqq", local_divergence, stats.max_lag, stats.sent,
                                                 stats.applied))
    rows = [struct.unpack("<dqqq", g) for g in gathered]
    sent = sum(r[2] for r in rows)
    applied = sum(r[3] for r in rows)
    if applied != world * sent:
        raise TrainingError(f"gradient sharing (max_staleness): the workers applied {applied} messages but sent "
                            f"{sent} to {world} workers (expected {world * sent}); a message was lost or applied "
                            "twice")
    return {
        "sharing.max_staleness": max_staleness,
        "sharing.max_lag_steps": max(r[1] for r in rows),
        "sharing.replica_divergence": max(r[0] for r in rows),
        "sharing.messages_sent": sent,
        "sharing.messages_applied": applied,
    }
