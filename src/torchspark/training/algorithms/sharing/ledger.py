"""The bookkeeping of bounded-staleness sharing: what a worker received from each peer, and its counters over a fit.

Every message between two workers carries ``[seq, epoch, length, flags]``
(`Envelope`); ``seq`` counts a sender's messages of the epoch from 0.
`PeerLedger` checks every arrival: a gap (a lost message), a repeat (it would be applied twice), a message
of another epoch or after the sender's end marker raise TrainingError. It also answers the loop's two questions:
does some peer still owe a message this worker must wait for (`PeerLedger.owed`), and how far ahead of its
slowest peer is it (`PeerLedger.lag`). `StaleStats` keeps a worker's counters over a fit.

Example::

    ledger = PeerLedger(peers=[1, 2], epoch=0)
    if ledger.accept(sender, envelope):   # an update to apply (False: the sender's END marker)
        ...
    while ledger.owed(step, k): ...       # wait for peers more than k steps behind
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from torchspark.errors import PeerLost, TrainingError
from torchspark.training.comm.mailbox import ABORT, END, MESSAGE, Envelope

__all__ = ["StaleStats", "PeerLedger"]


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

    ``received[p]`` counts ``p``'s messages taken in (and applied, see
    `stale_epoch`), ``ended[p]`` is the count ``p``'s END
    marker announced.
    """

    def __init__(self, peers: Iterable[int], epoch: int) -> None:
        self.epoch = epoch
        self.received = {p: 0 for p in peers}
        self.ended: dict[int, int] = {}

    def accept(self, sender: int, env: Envelope) -> bool:
        """Check ``env`` from ``sender``; True when it is an update message to apply, False for its END marker.

        Raises:
            PeerLost: the sender failed (its ``ABORT`` marker).
            TrainingError: the message belongs to another epoch, its ``seq`` skips one (a message was lost) or
                repeats one (it would be applied twice), or the marker's count disagrees with what arrived.
        """
        if env.flags == ABORT:
            raise PeerLost(
                f"gradient sharing: worker {sender} failed during epoch {env.epoch} and sends nothing more; its own "
                "error is the cause"
            )
        if sender not in self.received or sender in self.ended:
            raise TrainingError(
                f"gradient sharing: unexpected message from worker {sender} (epoch {self.epoch}, "
                f"{'after its end marker' if sender in self.ended else 'not a peer'})"
            )
        if env.epoch != self.epoch:
            raise TrainingError(
                f"gradient sharing: worker {sender} sent a message of epoch {env.epoch} while this "
                f"worker is in epoch {self.epoch}; all workers must run the same torchspark version"
            )
        expected = self.received[sender]
        if env.seq != expected:
            what = "lost (a gap)" if env.seq > expected else "repeated (a duplicate)"
            raise TrainingError(
                f"gradient sharing: message {expected} of worker {sender} in epoch {self.epoch} was "
                f"{what}: received seq {env.seq}; no message may be lost or applied twice"
            )
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
