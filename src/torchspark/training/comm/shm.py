"""All-reduce through shared memory for workers that share one host.

Workers on one machine (``local[N]``, several executors per node, ``ParallelWrapper``) do not need TCP to sum a
tensor: each copies its tensor into its own slot of a shared segment, then each sums one chunk over all slots
into the result area, then each copies the result out. Two tiny gloo barriers order the steps (so every wait
keeps the process group's timeout; FIFOs replace them when they can, `fifo_barrier`).
This is faster than gloo over loopback TCP, whose sums
are most of the averaging cost of small models.

Byte gathers (gradient sharing's per-step messages, `SharedMemoryReducer.all_gather_bytes`) use the same
slots: each rank writes ``[length][payload]`` into its slot, and every rank reads every slot between two barriers
(one write and one read instead of two gloo all-gathers).

Every element is summed by exactly one rank, in rank order, and every rank copies the same result: results are
bit-identical across ranks, as the [`Communicator`][torchspark.training.Communicator] contract requires.

Safety:
  * the segment is a file in ``/dev/shm`` (`SHM_DIR`) created by rank 0 with ``posix_fallocate`` (a full
    tmpfs fails here with ENOSPC instead of killing a worker with SIGBUS later) and unlinked as soon as every
    rank has mapped it, so a crashed worker leaves nothing behind;
  * ranks that cannot see rank 0's file (different hosts, different IPC namespaces such as two containers) or a
    missing/full ``/dev/shm`` make every rank agree to stay on gloo: the decision is collective.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import uuid
from collections.abc import Callable
from typing import Any

import torch

from torchspark.errors import TrainingError
from torchspark.training.rendezvous.netif import host_identity

__all__ = ["SharedMemoryReducer", "PostedGathers", "SHM_DIR", "MIN_NUMEL", "GATHER_MIN_BYTES", "host_id"]

log = logging.getLogger(__name__)

#: where segments live (a tmpfs on Linux)
SHM_DIR = "/dev/shm"
#: tensors smaller than this (in elements) go through gloo: two barriers cost more than sending them
MIN_NUMEL = 32_768
#: the smallest segment slot (bytes) set up for byte gathers: room for most sparse gradient-sharing messages
GATHER_MIN_BYTES = 1 << 20
_KEY = "torchspark/shm"
_LEN = struct.Struct("<q")


def host_id(address: str | None = None) -> str:
    """Who shares a host: the worker's advertised address (None: the hostname), network namespace and boot id
    (`torchspark.training.rendezvous.netif.host_identity`). Network namespaces and containers of one machine often
    share ``/dev/shm`` but are different hosts to their peers, so a shared directory alone proves nothing."""
    return host_identity(address)


class _Segment:
    """One mapped segment: ``world`` input slots and one result area of ``capacity`` float32 each."""

    def __init__(self, mm: mmap.mmap, world: int, capacity: int) -> None:
        self.mm = mm
        self.capacity = capacity
        whole = torch.frombuffer(mm, dtype=torch.float32, count=(world + 1) * capacity)
        self.slots = whole[: world * capacity].view(world, capacity)
        self.out = whole[world * capacity :]
        self.raw = memoryview(mm)  # the slots as bytes, for gathers

    def write_message(self, rank: int, payload: bytes, with_body: bool, half: int | None = None) -> None:
        """Slot ``rank`` := ``[len(payload)][payload]`` (the body only when ``with_body``); with ``half`` (0 or 1)
        into that half of the slot instead (`PostedGathers`)."""
        base = self._base(rank, half)
        _LEN.pack_into(self.raw, base, len(payload))
        if with_body:
            self.raw[base + _LEN.size : base + _LEN.size + len(payload)] = payload

    def message_length(self, rank: int, half: int | None = None) -> int:
        return int(_LEN.unpack_from(self.raw, self._base(rank, half))[0])

    def read_message(self, rank: int, length: int, half: int | None = None) -> bytes:
        base = self._base(rank, half) + _LEN.size
        return self.raw[base : base + length].tobytes()

    def half_nbytes(self) -> int:
        """Bytes in one half of a slot (length prefix included)."""
        return self.capacity * 2

    def _base(self, rank: int, half: int | None) -> int:
        return rank * self.capacity * 4 + (0 if half is None else half * self.capacity * 2)

    def close(self) -> None:
        del self.slots, self.out
        self.raw.release()
        try:
            self.mm.close()
        except BufferError:  # a caller still holds a view; the mapping goes away with the process
            log.debug("shared-memory segment still referenced; left to process exit")


class SharedMemoryReducer:
    """Sums float32 CPU tensors over ranks of one host through a shared segment.

    Args:
        store: the rendezvous store (rank 0 publishes the segment's name there).
        rank, world_size: this worker's place.
        barrier: a collective barrier with a timeout (a tiny gloo all-reduce).
        agree: ``agree(ok) -> bool``: a collective AND over ranks (all ranks must get the same answer).
    """

    def __init__(
        self, store: Any, rank: int, world_size: int, barrier: Callable[[], None], agree: Callable[[bool], bool]
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = store
        self._barrier = barrier
        self._agree = agree
        self._segment: _Segment | None = None
        self._generation = 0
        self._split: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.disabled = False

    @classmethod
    def for_host(
        cls,
        store: Any,
        rank: int,
        world_size: int,
        barrier: Callable[[], None],
        agree: Callable[[bool], bool],
        address: str | None = None,
    ) -> SharedMemoryReducer | None:
        """A reducer when every rank reports the same `host_id` (of its advertised ``address``) and
        ``/dev/shm`` exists, else None."""
        if world_size < 2:
            return None
        me = host_id(address)
        store.set(f"{_KEY}/host/{rank}", me)
        same = all(_text(store.get(f"{_KEY}/host/{r}")) == me for r in range(world_size))
        if not agree(same and os.path.isdir(SHM_DIR)):
            return None
        return cls(store, rank, world_size, barrier, agree)

    def set_barrier(
        self,
        barrier: Callable[[], None],
        arrive: Callable[[], None] | None = None,
        depart: Callable[[], None] | None = None,
    ) -> None:
        """Order the sums with a faster barrier (`FifoBarrier`); every rank
        must switch at the same point. With its two halves (``arrive``, ``depart``: ``barrier`` is both in turn)
        `posted_gathers` becomes available."""
        self._barrier = barrier
        self._split = (arrive, depart) if arrive is not None and depart is not None else None

    def posted_gathers(self) -> PostedGathers | None:
        """Collectively open split-phase byte gathers (`PostedGathers`); None (on every rank) without a split
        barrier or without a usable segment. Nothing else may use this reducer until `PostedGathers.close`."""
        if self._split is None or not self.stage(2 * GATHER_MIN_BYTES // 4):  # same decision on every rank
            return None
        return PostedGathers(self, *self._split)

    def accepts(self, tensor: torch.Tensor) -> bool:
        """Whether `all_reduce_sum` handles this tensor (same answer on every rank for the same call)."""
        return (
            not self.disabled
            and tensor.device.type == "cpu"
            and tensor.dtype == torch.float32
            and tensor.numel() >= MIN_NUMEL
        )

    def all_reduce_sum(self, tensor: torch.Tensor) -> bool:
        """Sum ``tensor`` over ranks in place. Returns False (tensor untouched, on every rank) when the segment
        could not be set up; the caller then uses its network backend and this reducer stays off."""
        n = tensor.numel()
        if not self.stage(n):
            return False
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
        self.slot(n).copy_(flat)
        total = self.reduce_slots(n)
        if tensor.is_contiguous():
            flat.copy_(total)
        else:
            tensor.copy_(total.view_as(tensor))
        return True

    # -- staged sums: the caller writes its input straight into its slot and reads the sum straight from the
    # -- result area, which saves the two copies of all_reduce_sum (most of the cost for a few MB)
    def stage(self, numel: int) -> bool:
        """Collectively make room for sums of ``numel`` elements. False (on every rank) when shared memory is
        unavailable; the reducer is then disabled."""
        if self.disabled:
            return False
        if self._segment is None or self._segment.capacity < numel:
            return self._grow(numel)
        return True

    def slot(self, numel: int) -> torch.Tensor:
        """This rank's input slot (its first ``numel`` elements; `stage` first). Fetch it anew for every
        sum: a later, larger sum replaces the segment."""
        assert self._segment is not None and self._segment.capacity >= numel, "stage(numel) first"
        return self._segment.slots[self.rank, :numel]

    def reduce_slots(self, numel: int) -> torch.Tensor:
        """Sum the first ``numel`` elements of every rank's slot: a barrier (all slots written), each rank sums
        its chunk into the result area, a barrier (the result is complete). Returns the result: shared by all
        ranks, read-only, valid until the next sum through this reducer."""
        seg = self._segment
        assert seg is not None and seg.capacity >= numel, "stage(numel) first"
        self._barrier()  # every input slot is written
        lo, hi = self.rank * numel // self.world_size, (self.rank + 1) * numel // self.world_size
        if hi > lo:
            torch.add(seg.slots[0, lo:hi], seg.slots[1, lo:hi], out=seg.out[lo:hi])
            for k in range(2, self.world_size):
                seg.out[lo:hi].add_(seg.slots[k, lo:hi])
        self._barrier()  # every chunk of the result is written
        return seg.out[:numel]

    # -- byte gathers (gradient sharing's per-step messages): length-prefixed payloads in the slots
    def all_gather_bytes(self, payload: bytes) -> list[bytes] | None:
        """Every rank's ``payload`` (lengths may differ), indexed by rank, through the segment: the payload goes
        into this rank's slot after its length, a barrier, every rank reads every slot, a barrier (nobody writes
        the next message before all have read). A payload larger than the slots makes every rank grow the segment
        (they all see the lengths) and write again. None (on every rank) when the segment cannot be set up."""
        if not self.stage(GATHER_MIN_BYTES // 4):  # the same size on every rank: growing is collective
            return None
        seg = self._segment
        assert seg is not None
        seg.write_message(self.rank, payload, with_body=_LEN.size + len(payload) <= seg.capacity * 4)
        self._barrier()  # every length (and every payload that fits) is written
        lengths = [seg.message_length(r) for r in range(self.world_size)]
        need = _LEN.size + max(lengths)
        if need > seg.capacity * 4:  # somebody's payload did not fit: all ranks know it and grow together
            self._barrier()  # every rank has read the lengths before the segment is replaced
            if not self.stage(need // 4 + 1):
                return None
            seg = self._segment
            assert seg is not None
            seg.write_message(self.rank, payload, with_body=True)
            self._barrier()
        out = [seg.read_message(r, n) for r, n in enumerate(lengths)]
        self._barrier()  # every rank has read every slot
        return out

    def _grow(self, numel: int) -> bool:
        """Collectively replace the segment by one holding ``numel`` elements per slot."""
        self._generation += 1
        key = f"{_KEY}/segment/{self._generation}"
        nbytes = (self.world_size + 1) * numel * 4
        path = ""
        mm: mmap.mmap | None = None
        if self.rank == 0:
            path, mm = _create(nbytes)
            self._store.set(key, path)
        else:
            path = _text(self._store.get(key))
            mm = _attach(path, nbytes) if path else None
        try:
            ok = self._agree(mm is not None)  # every rank has mapped it (or someone failed)
        finally:  # also when a peer is lost during the agreement: nobody else would ever remove the file
            if self.rank == 0 and path:
                _unlink(path)
        if not ok:
            if mm is not None:
                mm.close()
            self.disabled = True
            log.info("shared-memory all-reduce unavailable (segment of %d bytes); using the network backend", nbytes)
            return False
        if self._segment is not None:
            self._segment.close()
        assert mm is not None
        self._segment = _Segment(mm, self.world_size, numel)
        return True

    def close(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None


class PostedGathers:
    """Split-phase byte gathers through the segment, for a loop that posts one message per step and collects the
    round later (gradient sharing with overlap): ``post(m_t)``, compute, ``collect() -> [m_t of every rank]``,
    ``post(m_{t+1})``, ... and ``close()`` after the last collect.

    ``post`` writes ``[length][payload]`` into one half of this rank's slot (halves alternate by round) and
    arrives at the barrier without waiting; ``collect`` waits for every peer's arrival and reads every rank's half.
    Why two halves and one barrier per round are enough: a rank posts round ``t + 2`` into the half of round ``t``
    only after collecting round ``t + 1``, i.e. after every peer posted ``t + 1``, which each did after reading round
    ``t``. So the overlap needs no exchange thread (no hand-off, no GIL contention) and half the barriers of
    `SharedMemoryReducer.all_gather_bytes`.

    A payload longer than a half makes every rank (all see the lengths) grow the segment and repeat the round
    synchronously. Every wait carries the barrier's timeout. Collective like any gather: every rank posts and
    collects the same rounds in the same order, and issues no other collective on this group between a ``post``
    and its ``collect``.
    """

    def __init__(self, reducer: SharedMemoryReducer, arrive: Callable[[], None], depart: Callable[[], None]) -> None:
        self._reducer = reducer
        self._arrive = arrive
        self._depart = depart
        self._round = 0
        self._posted: bytes | None = None

    def post(self, payload: bytes) -> None:
        """This rank's message of the next round; returns at once."""
        if self._posted is not None:
            raise RuntimeError("PostedGathers.post twice without collect: collect every round before the next")
        seg = self._segment()
        seg.write_message(
            self._reducer.rank, payload, with_body=_LEN.size + len(payload) <= seg.half_nbytes(), half=self._round % 2
        )
        self._posted = payload
        self._arrive()

    def collect(self) -> list[bytes]:
        """Every rank's message of the posted round, indexed by rank (waits for the slowest peer)."""
        payload, self._posted = self._posted, None
        if payload is None:
            raise RuntimeError("PostedGathers.collect without post")
        self._depart()  # every rank's length (and every payload that fits) is written
        seg = self._segment()
        half = self._round % 2
        self._round += 1
        world = self._reducer.world_size
        lengths = [seg.message_length(r, half) for r in range(world)]
        if _LEN.size + max(lengths) <= seg.half_nbytes():
            return [seg.read_message(r, n, half) for r, n in enumerate(lengths)]
        # somebody's payload did not fit: every rank knows it; this round is repeated through a grown segment
        self._arrive()
        self._depart()  # every rank has read the lengths before the segment is replaced
        if not self._reducer.stage(2 * (_LEN.size + max(lengths)) // 4 + 2):
            raise TrainingError(
                "the shared-memory segment could not grow for a gradient-sharing message of "
                f"{max(lengths)} bytes; free space in {SHM_DIR} or train with overlap=False"
            )
        seg = self._segment()
        seg.write_message(self._reducer.rank, payload, with_body=True, half=0)
        self._arrive()
        self._depart()
        out = [seg.read_message(r, n, 0) for r, n in enumerate(lengths)]
        self._arrive()
        self._depart()  # every rank has read half 0 before anybody posts into it again
        self._round = 1
        return out

    def close(self) -> None:
        """After the last `collect` (collective): one barrier, so nobody reads a half any more when the
        segment is used for something else."""
        if self._posted is not None:
            raise RuntimeError("PostedGathers.close with a posted round not collected")
        self._arrive()
        self._depart()

    def _segment(self) -> _Segment:
        seg = self._reducer._segment
        assert seg is not None, "the segment is staged when the gathers open"
        return seg


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _create(nbytes: int) -> tuple[str, mmap.mmap | None]:
    """Rank 0: a new, fully allocated segment file; ``("", None)`` when ``/dev/shm`` cannot hold it."""
    path = os.path.join(SHM_DIR, f"torchspark-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        log.info("cannot create %s: %s", path, e)
        return "", None
    try:
        os.posix_fallocate(fd, 0, nbytes)  # reserve tmpfs pages now: ENOSPC here, not SIGBUS later
        return path, mmap.mmap(fd, nbytes)
    except OSError as e:
        log.info("cannot allocate %d bytes in %s: %s", nbytes, SHM_DIR, e)
        _unlink(path)
        return "", None
    finally:
        os.close(fd)


def _attach(path: str, nbytes: int) -> mmap.mmap | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:  # another host or IPC namespace: rank 0's file is not visible here
        log.info("cannot open %s: %s", path, e)
        return None
    try:
        if os.fstat(fd).st_size < nbytes:
            return None
        return mmap.mmap(fd, nbytes)
    except OSError as e:
        log.info("cannot map %s: %s", path, e)
        return None
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
