"""Communicators: the collectives a training worker needs, over torch.distributed or in-process threads.

A communicator sums tensors across workers and gathers variable-length byte messages. The training loops use
nothing else, so the same loop runs inside a Spark barrier stage (gloo/nccl), in local processes
(``ParallelWrapper``) or in threads of one process (tests, the in-process runner).
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Protocol, cast

import torch
import torch.distributed as dist

from torchspark.errors import SetupError, WaitTimeout
from torchspark.training.comm import shm as _shm
from torchspark.training.comm.fifo_barrier import FifoBarrier
from torchspark.training.comm.shm import MIN_NUMEL, PostedGathers, SharedMemoryReducer

__all__ = [
    "Communicator",
    "SoloCommunicator",
    "ThreadGroup",
    "ThreadCommunicator",
    "TorchDistCommunicator",
    "StagedSum",
    "staged_sum",
]

log = logging.getLogger(__name__)


class Communicator(Protocol):
    """What a training loop needs from its peers. Every call is collective: all ranks call it in the same order."""

    rank: int
    world_size: int

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over all workers, in place; every rank gets bit-identical results. Returns it."""
        ...

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every worker's ``payload`` (lengths may differ), indexed by rank."""
        ...

    def all_to_all_bytes(self, payloads: list[bytes]) -> list[bytes]:
        """Personalised exchange: ``payloads[j]`` goes to rank ``j`` (one per rank, lengths may differ); returns
        what every rank sent to this one, indexed by source rank."""
        ...

    def close(self) -> None:
        """Release the group (idempotent)."""
        ...


class StagedSum:
    """A float32 sum over ranks whose input is written in place and whose result is read in place.

    For callers that pack many tensors into one sum every round (parameter averaging): ``buf = s.buffer()``, fill
    all of it, ``total = s.reduce()``. Through shared memory ([`TorchDistCommunicator.staged_sum`][torchspark.training.TorchDistCommunicator.staged_sum]) ``buffer``
    is this rank's slot of the shared segment and ``total`` its result area, which saves the copy in and the copy
    out of [`Communicator.all_reduce_sum`][torchspark.training.Communicator.all_reduce_sum] (half the memory traffic of a round). This base class is the
    portable version: a private buffer summed in place by ``all_reduce_sum``.

    Rules: fetch ``buffer()`` anew before every sum (a later, larger sum may move it); treat ``total`` as read-only
    and use it before the next collective on the same communicator. ``reduce`` is collective.
    """

    def __init__(self, comm: Communicator, numel: int, device: torch.device | str = "cpu") -> None:
        self.numel = numel
        self._comm = comm
        self._buf = torch.empty(numel, dtype=torch.float32, device=device)

    def buffer(self) -> torch.Tensor:
        return self._buf

    def reduce(self) -> torch.Tensor:
        return self._comm.all_reduce_sum(self._buf)


class _SharedMemoryStagedSum(StagedSum):
    def __init__(self, reducer: SharedMemoryReducer, numel: int) -> None:  # noqa: D107 - no private buffer
        self.numel = numel
        self._reducer = reducer

    def buffer(self) -> torch.Tensor:
        return self._reducer.slot(self.numel)

    def reduce(self) -> torch.Tensor:
        return self._reducer.reduce_slots(self.numel)


def staged_sum(comm: Communicator, numel: int, device: torch.device | str = "cpu") -> StagedSum:
    """The fastest `StagedSum` ``comm`` offers for ``numel`` float32 values on ``device`` (collective: every
    rank calls it with the same ``numel``)."""
    make = getattr(comm, "staged_sum", None)
    return make(numel, device) if make is not None else StagedSum(comm, numel, device)


class SoloCommunicator:
    """A world of one: collectives are identities."""

    rank = 0
    world_size = 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return [payload]

    def all_to_all_bytes(self, payloads: list[bytes]) -> list[bytes]:
        _check_payloads(payloads, 1)
        return [bytes(payloads[0])]

    def close(self) -> None:
        return None


class ThreadGroup:
    """Shared state of ``world_size`` in-process workers (one thread each).

    Args:
        world_size: number of threads that will call the collectives.
        timeout_s: how long one collective waits for the slowest thread before raising [`WaitTimeout`][torchspark.errors.WaitTimeout].
    """

    def __init__(self, world_size: int, timeout_s: float = 300.0) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[object] = [None] * world_size

    def communicator(self, rank: int) -> ThreadCommunicator:
        return ThreadCommunicator(self, rank)

    def abort(self) -> None:
        """Wake every waiting thread with an error (a peer failed)."""
        self._barrier.abort()

    @property
    def aborted(self) -> bool:
        """Whether the group was aborted (a peer failed): waits on it fail at once."""
        return self._barrier.broken

    def _exchange(self, rank: int, value: object) -> list[object]:
        self._slots[rank] = value
        self._wait()
        values = list(self._slots)
        self._wait()  # nobody overwrites a slot before everyone has read it
        return values

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError as e:
            raise WaitTimeout(
                f"a peer worker did not reach the collective within rendezvous_timeout_s={self.timeout_s} "
                "(or failed); raise rendezvous_timeout_s if workers are merely slow"
            ) from e


class ThreadCommunicator:
    """One thread's view of a [`ThreadGroup`][torchspark.training.ThreadGroup]."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = cast("list[torch.Tensor]", self.group._exchange(self.rank, tensor.detach().clone()))
        total = parts[0].clone()
        for p in parts[1:]:  # rank order: identical arithmetic on every rank
            total += p
        tensor.copy_(total)
        return tensor

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return cast("list[bytes]", self.group._exchange(self.rank, payload))

    def all_to_all_bytes(self, payloads: list[bytes]) -> list[bytes]:
        _check_payloads(payloads, self.world_size)
        sent = self.group._exchange(self.rank, list(payloads))
        return [bytes(row[self.rank]) for row in sent]  # type: ignore[index]

    def close(self) -> None:
        return None


class TorchDistCommunicator:
    """A torch.distributed process group (gloo on CPU, nccl on CUDA) built from a ``TCPStore``.

    Args:
        store: a ``torch.distributed.Store`` every rank can reach (rank 0 hosts it).
        rank, world_size: this worker's place.
        backend: ``"gloo"`` or ``"nccl"``.
        device: where collective buffers live (CUDA for nccl).
        timeout_s: the collective timeout (``rendezvous_timeout_s``); a peer that never arrives fails the job
            after this long instead of hanging it.
        shared_memory: with gloo, sum large float32 tensors and gather byte messages through ``/dev/shm`` when
            every rank is on the same host (`torchspark.training.comm.shm`; faster than loopback TCP, most of all for
            small gathers). Ranks on different hosts, or without a usable ``/dev/shm``, agree to
            stay on gloo.
        host_address: the address this worker advertises to its peers; with the network namespace it tells
            which ranks share a host (None: the hostname, right for local process groups).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        device: torch.device | str = "cpu",
        timeout_s: float = 300.0,
        shared_memory: bool = True,
        host_address: str | None = None,
    ) -> None:
        if dist.is_initialized():
            raise SetupError(
                "a torch.distributed process group is already active in this worker process; "
                "torchspark needs its own (is another training job running in the same Python worker?)"
            )
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
        )
        self._open = True
        self._shm: SharedMemoryReducer | None = None
        self._fifo: FifoBarrier | None = None
        if shared_memory and backend == "gloo" and world_size > 1:
            self._shm = SharedMemoryReducer.for_host(
                store, rank, world_size, self._barrier, self._all_agree, host_address
            )
            if self._shm is not None:  # same host: its barriers go through FIFOs when they can (else gloo)
                self._fifo = FifoBarrier.create(store, rank, world_size, self._all_agree, timeout_s, _shm.SHM_DIR)
                if self._fifo is not None:
                    self._shm.set_barrier(self._fifo.wait, self._fifo.arrive, self._fifo.depart)

    @property
    def uses_shared_memory(self) -> bool:
        """Whether large sums go through shared memory (all ranks on one host) rather than the network."""
        return self._shm is not None and not self._shm.disabled

    def posted_gathers(self) -> PostedGathers | None:
        """Split-phase byte gathers (`PostedGathers`) when every rank shares this
        host and its barriers go through FIFOs, else None (on every rank). Collective."""
        if self._shm is None or self._fifo is None:
            return None
        return self._shm.posted_gathers()

    def _barrier(self) -> None:
        flag = torch.zeros(1)
        self._call(lambda: dist.all_reduce(flag))

    def _all_agree(self, ok: bool) -> bool:
        flag = torch.tensor([1.0 if ok else 0.0])
        self._call(lambda: dist.all_reduce(flag))
        return int(flag.item()) == self.world_size

    def staged_sum(self, numel: int, device: torch.device | str = "cpu") -> StagedSum:
        """A `StagedSum` through the shared segment when this group uses shared memory and the sum is large
        enough to gain from it, else the portable one (collective: every rank calls it with the same ``numel``)."""
        if (
            self._shm is not None
            and torch.device(device).type == "cpu"
            and numel >= MIN_NUMEL
            and self._shm.stage(numel)
        ):
            return _SharedMemoryStagedSum(self._shm, numel)
        return StagedSum(self, numel, device)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._shm is not None and self._shm.accepts(tensor) and self._shm.all_reduce_sum(tensor):
            return tensor
        if tensor.device != self.device:
            moved = tensor.to(self.device)
            self._call(lambda: dist.all_reduce(moved))
            tensor.copy_(moved)
        else:
            self._call(lambda: dist.all_reduce(tensor))
        return tensor

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        if self._shm is not None:  # None back (on every rank) when shared memory is unavailable
            gathered = self._shm.all_gather_bytes(payload)
            if gathered is not None:
                return gathered
        n = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(n) for _ in range(self.world_size)]
        self._call(lambda: dist.all_gather(sizes, n))
        lengths = [int(s.item()) for s in sizes]
        width = max(max(lengths), 1)
        buf = torch.zeros(width, dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        buf = buf.to(self.device)
        outs = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in range(self.world_size)]
        self._call(lambda: dist.all_gather(outs, buf))
        return [o[:length].cpu().numpy().tobytes() for o, length in zip(outs, lengths)]

    def all_to_all_bytes(self, payloads: list[bytes]) -> list[bytes]:
        """Two ``all_to_all_single`` calls: the N sizes, then one uint8 buffer split unevenly (works on gloo, where
        the list form ``all_to_all`` needs equal sizes, and on nccl). Shared memory is not used for this one."""
        _check_payloads(payloads, self.world_size)
        send_sizes = torch.tensor([len(p) for p in payloads], dtype=torch.int64, device=self.device)
        recv_sizes = torch.empty_like(send_sizes)
        self._call(lambda: dist.all_to_all_single(recv_sizes, send_sizes))
        ins = [int(v) for v in send_sizes.cpu()]
        outs = [int(v) for v in recv_sizes.cpu()]
        joined = b"".join(payloads)
        send = torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        send = send.to(self.device)
        recv = torch.empty(sum(outs), dtype=torch.uint8, device=self.device)
        self._call(lambda: dist.all_to_all_single(recv, send, output_split_sizes=outs, input_split_sizes=ins))
        data = recv.cpu().numpy().tobytes()
        offsets = [0]
        for size in outs:
            offsets.append(offsets[-1] + size)
        return [data[a:b] for a, b in zip(offsets, offsets[1:])]

    def _call(self, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except RuntimeError as e:
            text = str(e)
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise WaitTimeout(
                    f"a collective did not complete within rendezvous_timeout_s={self.timeout_s}: {text}. "
                    "A peer worker is stuck or gone; raise rendezvous_timeout_s if it is merely slow."
                ) from e
            raise

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if self._fifo is not None:
            self._fifo.close()
            self._fifo = None
        if self._open and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError) as e:  # already torn down by a failed peer
                log.debug("destroy_process_group: %s", e)
        self._open = False


def _check_payloads(payloads: list[bytes], world_size: int) -> None:
    if len(payloads) != world_size:
        raise ValueError(f"all_to_all_bytes needs one payload per rank ({world_size}), got {len(payloads)}")
