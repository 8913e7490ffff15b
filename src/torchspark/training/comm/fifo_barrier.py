"""A barrier for processes of one host through named pipes, cheaper than a gloo barrier.

The shared-memory sum (`torchspark.training.comm.shm`) needs two barriers per sum. Over gloo each is a tiny
all-reduce through loopback TCP, a noticeable part of an averaging round of a small model. Here every rank owns a
FIFO in ``/dev/shm``; arriving at the
barrier writes one byte into every peer's FIFO, then reads ``world - 1`` bytes from its own (a counting barrier:
no rank can be more than one barrier ahead, so the bytes of consecutive barriers never mix up).

Ordering: the slot data a rank wrote before arriving is visible to a peer that has left the barrier, because the
kernel orders the pipe write before the peer's read (the pipe's lock is a release/acquire pair).

Split phase (`FifoBarrier.arrive` now, `FifoBarrier.depart` later): a rank can do its own work between
announcing its arrival and waiting for the others (gradient sharing's posted gathers, `PostedGathers`). The counting argument still holds: a rank arrives at barrier ``b + 1`` only after departing
from ``b``, so no rank is more than one barrier ahead of any peer.

Waits have the collective timeout (``rendezvous_timeout_s``). When every peer has exited the FIFO reports end of
file and the wait fails at once (with two workers: as soon as the peer dies); otherwise the runners (Spark's
barrier stage, ParallelWrapper's supervisor) stop the other workers when one fails, and the timeout covers the
rest.
"""

from __future__ import annotations

import logging
import os
import select
import uuid
from collections.abc import Callable
from typing import Any

from torchspark.errors import PeerLost, WaitTimeout

__all__ = ["FifoBarrier"]

log = logging.getLogger(__name__)

_KEY = "torchspark/fifo"


class FifoBarrier:
    """``wait()`` returns when every rank has called it; created collectively by `create`."""

    def __init__(self, read_fd: int, write_fds: list[int], world_size: int, timeout_s: float) -> None:
        self._read_fd = read_fd
        self._write_fds = write_fds
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._poll = select.poll()
        self._poll.register(read_fd, select.POLLIN)

    @classmethod
    def create(
        cls, store: Any, rank: int, world_size: int, agree: Callable[[bool], bool], timeout_s: float, directory: str
    ) -> FifoBarrier | None:
        """Collectively set up the FIFOs in ``directory``; None on every rank when any rank cannot (then the
        caller keeps its network barrier). The FIFO files are unlinked as soon as every rank has opened them."""
        path = os.path.join(directory, f"torchspark-fifo-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        read_fd = -1
        try:
            os.mkfifo(path, 0o600)
            read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # non-blocking: needs no writer yet
        except OSError as e:
            log.info("cannot create a FIFO in %s: %s", directory, e)
            path = ""
        write_fds: list[int] = []
        ready = False  # stays False when a peer is lost during the set-up (agree or the store raises)
        try:
            store.set(f"{_KEY}/{rank}", path)
            ok = agree(read_fd >= 0)  # every rank has its FIFO open for reading
            if ok:
                try:
                    for r in range(world_size):
                        if r != rank:
                            peer = store.get(f"{_KEY}/{r}")
                            peer_path = peer.decode() if isinstance(peer, (bytes, bytearray)) else str(peer)
                            write_fds.append(os.open(peer_path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError as e:  # another IPC namespace: the path is not this rank's FIFO
                    log.info("cannot open a peer's FIFO: %s", e)
                    ok = False
            ready = agree(ok)  # every rank has opened every peer's FIFO
        finally:  # whatever happened: nobody else would ever remove this rank's FIFO
            if path:
                _unlink(path)
            if not ready:
                for fd in [read_fd, *write_fds]:
                    if fd >= 0:
                        os.close(fd)
        if not ready:
            return None
        return cls(read_fd, write_fds, world_size, timeout_s)

    def wait(self) -> None:
        """Arrive and wait for every peer: `arrive` then `depart`."""
        self.arrive()
        self.depart()

    def arrive(self) -> None:
        """Tell every peer this rank has arrived (never blocks: a pipe holds far more than the one byte per barrier
        a peer can be behind). Pair every call with one `depart`, with no other barrier in between."""
        for fd in self._write_fds:
            try:
                os.write(fd, b"\x01")
            except OSError as e:
                raise PeerLost(f"a peer worker left the shared-memory barrier ({e}); it has failed or exited") from e

    def depart(self) -> None:
        """Wait until every peer has arrived at the barrier this rank last `arrive`-d at (timeout:
        ``rendezvous_timeout_s``). Work done between the two calls overlaps the wait for the slowest peer."""
        need = self.world_size - 1
        while need:
            if not self._poll.poll(self.timeout_s * 1000):
                raise WaitTimeout(
                    f"a peer worker did not reach the shared-memory barrier within rendezvous_timeout_s="
                    f"{self.timeout_s}; it is stuck or gone (raise rendezvous_timeout_s if it is merely slow)"
                )
            try:
                got = os.read(self._read_fd, need)
            except BlockingIOError:  # woken without data (spurious): poll again
                continue
            if not got:  # end of file: no peer holds a write end any more
                raise PeerLost("every peer worker left the shared-memory barrier (exited or failed)")
            need -= len(got)

    def close(self) -> None:
        for fd in [self._read_fd, *self._write_fds]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._write_fds = []
        self._read_fd = -1


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
