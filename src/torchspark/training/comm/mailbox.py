"""Asynchronous point-to-point mailboxes for the bounded-staleness gradient-sharing loop.

A `Mailbox` sends one worker's messages to every peer without waiting for anyone, and hands over the peers'
messages as they arrive. It is the transport of `torchspark.training.algorithms.sharing.stale`; the
synchronous loop uses collectives instead. Every message is an `Envelope`: a fixed header
``[seq, epoch, length, flags]`` and a payload of ``length`` bytes. The mailbox only moves bytes, in order per
sender; checking the sequence numbers is the loop's job (so a lost or repeated message is detected whatever the
transport).

Two transports (`open_mailbox` picks the one of the communicator):

* `ThreadMailbox` -- workers that are threads of one process ([`ThreadGroup`][torchspark.training.ThreadGroup]):
  one queue per (receiver, sender) pair, kept on the group across epochs.
* `TorchDistMailbox` -- a torch.distributed (gloo) process group: per epoch one sender thread
  (``dist.isend`` to every peer) and one receiver thread per peer (blocking ``dist.recv``), which stops after that
  peer's end-of-epoch marker: at the end of an epoch nothing is left posted, and the group is free for
  collectives.

Rules for the caller: open one mailbox per epoch (`open_mailbox`), run no collective on the communicator while
it is open, and always `Mailbox.close` it (normal end: after every peer's end marker was received; it then
waits until the peers received ours). Every wait carries the communicator's timeout (``rendezvous_timeout_s``).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from torchspark.errors import ConfigError, TrainingError, WaitTimeout
from torchspark.training.comm.communicators import SoloCommunicator, ThreadCommunicator, TorchDistCommunicator
from torchspark.training.waiting import Deadline, join_within

__all__ = ["Envelope", "Mailbox", "ThreadMailbox", "TorchDistMailbox", "open_mailbox", "END", "MESSAGE", "ABORT"]

log = logging.getLogger(__name__)

#: ``Envelope.flags``: an update message, or the end-of-epoch marker (``seq`` = the number of messages sent)
MESSAGE = 0
END = 1
#: ``Envelope.flags``: the sender failed and sends nothing more this epoch (its receivers may stop waiting for it)
ABORT = 2
_HEADER_TAG = 7_100
_PAYLOAD_TAG = 7_101
# how long close() waits for the transport thread after an error (the process is failing anyway)
_ERROR_JOIN_S = 2.0
# how often a blocked take() wakes up to check whether the group was aborted
_WAKE_S = 0.1


@dataclass(frozen=True)
class Envelope:
    """One message between two workers: ``seq`` numbers a sender's messages of an ``epoch`` from 0."""

    seq: int
    epoch: int
    flags: int
    payload: bytes = b""


class Mailbox(Protocol):
    """One epoch's asynchronous channel from this worker to every peer and back."""

    def post(self, envelope: Envelope) -> None:
        """Send ``envelope`` to every peer; returns at once."""
        ...

    def receive(self, senders: set[int], timeout_s: float | None) -> tuple[int, Envelope] | None:
        """The next message of one of ``senders`` (in order per sender): block up to ``timeout_s`` (None: do not
        block); None when nothing came."""
        ...

    def close(self, failed: bool = False) -> None:
        """End of the epoch (``failed``: after an error, do not wait for peers beyond a few seconds)."""
        ...


def open_mailbox(comm: Any, epoch: int) -> tuple[Mailbox, float]:
    """The mailbox of ``comm``'s transport for one epoch, and the timeout of every wait on it (seconds)."""
    if isinstance(comm, ThreadCommunicator):
        return ThreadMailbox(comm), comm.group.timeout_s
    if isinstance(comm, TorchDistCommunicator):
        backend = dist.get_backend()
        if backend != "gloo":
            raise ConfigError(
                f"max_staleness sends point-to-point over gloo, but the workers' process group uses "
                f"{backend!r} (GPU workers); use max_staleness=None (synchronous sharing) on GPUs"
            )
        return TorchDistMailbox(comm.rank, comm.world_size, epoch), comm.timeout_s
    if isinstance(comm, SoloCommunicator) or getattr(comm, "world_size", None) == 1:
        return ThreadMailbox(None), 300.0
    raise ConfigError(
        f"max_staleness needs a ThreadCommunicator or TorchDistCommunicator, got "
        f"{type(comm).__name__}; use max_staleness=None (synchronous sharing) with it"
    )


class _Inbox:
    """Per-sender FIFO queues with one condition (the receiving side of both transports)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[int, collections.deque[Envelope]] = collections.defaultdict(collections.deque)
        self.error: BaseException | None = None

    def put(self, sender: int, envelope: Envelope) -> None:
        with self.cond:
            self.queues[sender].append(envelope)
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def take(self, senders: set[int], timeout_s: float | None, broken: Any = None) -> tuple[int, Envelope] | None:
        deadline = None if timeout_s is None else Deadline.after(timeout_s)
        with self.cond:
            while True:
                if self.error is not None:
                    raise TrainingError(f"the gradient-sharing mailbox failed: {self.error}") from self.error
                for sender in sorted(senders):
                    queue = self.queues.get(sender)
                    if queue:
                        return sender, queue.popleft()
                if broken is not None and broken():
                    raise TrainingError(
                        "a peer worker failed (its group was aborted) while this worker waited "
                        "for its gradient-sharing messages"
                    )
                if deadline is None or deadline.expired:
                    return None
                self.cond.wait(deadline.left(cap=_WAKE_S))


class ThreadMailbox:
    """Mailbox between threads of one process: ``post`` appends to every peer's queue for this sender.

    The queues belong to the [`ThreadGroup`][torchspark.training.ThreadGroup] (created by whichever rank comes first),
    so messages a fast peer posts for its next epoch wait there until this worker opens its next mailbox.
    """

    def __init__(self, comm: ThreadCommunicator | None) -> None:
        self.rank = 0 if comm is None else comm.rank
        self.world = 1 if comm is None else comm.world_size
        self._group = None if comm is None else comm.group
        self._inboxes: list[_Inbox] = []
        if self._group is not None:
            with _GROUP_LOCK:
                self._inboxes = _GROUP_INBOXES.setdefault(self._group, [_Inbox() for _ in range(self.world)])

    def post(self, envelope: Envelope) -> None:
        for peer, inbox in enumerate(self._inboxes):
            if peer != self.rank:
                inbox.put(self.rank, envelope)

    def receive(self, senders: set[int], timeout_s: float | None) -> tuple[int, Envelope] | None:
        if not self._inboxes:
            return None
        group = self._group
        return self._inboxes[self.rank].take(senders, timeout_s, lambda: group is not None and group.aborted)

    def close(self, failed: bool = False) -> None:
        return None


_GROUP_LOCK = threading.Lock()
# every ThreadGroup's inboxes, by receiver rank, for as long as the group lives
_GROUP_INBOXES: weakref.WeakKeyDictionary[Any, list[_Inbox]] = weakref.WeakKeyDictionary()


class TorchDistMailbox:
    """Mailbox over the default torch.distributed (gloo) group: one sender thread, one receiver thread per peer.

    Per message and peer the sender does ``isend`` of the int64 header ``[seq, epoch, length, flags]`` (tag 7100),
    then of the ``length`` payload bytes (tag 7101) when there are any, and waits for them in order. The receiver
    thread of a peer does blocking ``recv`` of a header, then of its payload, delivers the envelope, and stops after
    that peer's ``END`` marker, so a closed mailbox leaves no receive posted and the group is free for collectives.

    Why threads and blocking waits: in torch 2.13 a gloo send/recv ``Work`` never reports ``is_completed()`` before
    ``wait()`` (checked), so one polling thread cannot work. Point-to-point calls on one gloo group from several
    threads of a process are not documented as safe; they work in torch 2.13 under test
    (``tests/multiprocess/test_mailbox_gloo.py``: three processes, each a sender and two receiver threads, payloads
    up to 240 kB, a collective between epochs). Distinct tags keep them apart from collectives. A gloo receive
    cannot be cancelled (``Work`` has no ``abort``), so a failing worker ends its peers' waits instead: its
    ``close(failed=True)`` sends every peer an ``ABORT`` marker, which ends that peer's receiver thread for it (the
    peer's ledger raises [`PeerLost`][torchspark.errors.PeerLost], and the peer, failing in turn, sends its own). Once
    every worker has failed, every receiver thread has ended; ``close(failed=True)`` waits up to 2 s for this
    worker's, and any still blocked (a peer that died without a word) end when the process group is destroyed.
    """

    def __init__(self, rank: int, world_size: int, epoch: int) -> None:
        self.rank = rank
        self.world = world_size
        self.epoch = epoch
        self._inbox = _Inbox()
        self._outgoing: queue.Queue[Envelope | None] = queue.Queue()
        self._threads = [
            threading.Thread(
                target=self._guard, args=(self._send_loop,), daemon=True, name=f"torchspark-mailbox-send-{rank}"
            )
        ]
        self._threads += [
            threading.Thread(
                target=self._guard,
                args=(self._receive_loop, p),
                daemon=True,
                name=f"torchspark-mailbox-recv-{rank}-from-{p}",
            )
            for p in range(world_size)
            if p != rank
        ]
        for t in self._threads:
            t.start()

    def post(self, envelope: Envelope) -> None:
        if self._inbox.error is not None:
            raise TrainingError(f"the gradient-sharing mailbox failed: {self._inbox.error}") from self._inbox.error
        self._outgoing.put(envelope)

    def receive(self, senders: set[int], timeout_s: float | None) -> tuple[int, Envelope] | None:
        return self._inbox.take(senders, timeout_s)

    def close(self, failed: bool = False, timeout_s: float = 300.0) -> None:
        """Normal end (every peer's END received): wait up to ``timeout_s`` until the peers received all we sent.
        After an error: send every peer ``ABORT`` and wait up to 2 s for the threads (see the class docstring)."""
        if failed:
            self._outgoing.put(Envelope(0, self.epoch, ABORT))
        self._outgoing.put(None)
        join_within(self._threads, _ERROR_JOIN_S if failed else timeout_s)
        alive = [t.name for t in self._threads if t.is_alive()]
        if failed:
            if alive:
                log.debug("gradient-sharing mailbox threads still blocked after an error: %s", alive)
            return
        if alive:
            raise WaitTimeout(
                f"gradient-sharing messages were not delivered within rendezvous_timeout_s="
                f"{timeout_s} ({alive} still waiting); a peer worker is stuck or gone (raise "
                "rendezvous_timeout_s if it is merely slow)"
            )
        if self._inbox.error is not None:
            raise TrainingError(f"the gradient-sharing mailbox failed: {self._inbox.error}") from self._inbox.error

    # ------------------------------------------------------------------ the transport threads
    def _guard(self, loop: Any, *args: Any) -> None:
        try:
            loop(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread through the inbox
            log.debug("gradient-sharing mailbox thread failed: %s", e)
            self._inbox.fail(e)

    def _send_loop(self) -> None:
        peers = [p for p in range(self.world) if p != self.rank]
        while True:
            env = self._outgoing.get()
            if env is None:
                return
            header = torch.tensor([env.seq, env.epoch, len(env.payload), env.flags], dtype=torch.int64)
            body = torch.frombuffer(bytearray(env.payload), dtype=torch.uint8) if env.payload else None
            works = []
            for p in peers:
                works.append(dist.isend(header, p, tag=_HEADER_TAG))
                if body is not None:
                    works.append(dist.isend(body, p, tag=_PAYLOAD_TAG))
            for w in works:
                if w is not None:  # isend returns None only outside a process group's ranks
                    w.wait()

    def _receive_loop(self, peer: int) -> None:
        while True:
            header = torch.empty(4, dtype=torch.int64)
            dist.recv(header, peer, tag=_HEADER_TAG)
            seq, epoch, length, flags = (int(v) for v in header)
            payload = b""
            if length > 0:
                body = torch.empty(length, dtype=torch.uint8)
                dist.recv(body, peer, tag=_PAYLOAD_TAG)
                payload = body.numpy().tobytes()
            self._inbox.put(peer, Envelope(seq, epoch, flags, payload))
            if flags in (END, ABORT):
                return
