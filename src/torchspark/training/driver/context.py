"""The driver's side of one attempt of a fit, offered to the runner: `FitContext` (the
`RunContext` of `run_fit`): the progress
channel (server or directory), the watchdogs (silent workers; no progress: [`stall`][torchspark.training.driver.stall]),
the workers' reported errors and pids, the furthest progress heard."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from torchspark._io import join
from torchspark.errors import WorkerLost
from torchspark.nn import Network
from torchspark.training.driver.stall import ProgressStall
from torchspark.training.hooks import PhaseRecorder, ProgressUpdate, ScoreReport
from torchspark.training.progress import (
    DirectoryProgressReader,
    ProgressDirectory,
    ProgressEndpoint,
    ProgressServer,
)
from torchspark.training.rendezvous.ports import listen_in_range

__all__ = ["FitContext"]

log = logging.getLogger(__name__)


class FitContext:
    """The driver's side of one fit, offered to the runner (the `RunContext`).

    The progress server opens only when a runner asks for its address: the rounds route reports progress from the
    driver (`notify`) and needs no port.

    Args:
        network: the driver's network.
        recorder: the driver's stats recorder.
        description: names the fit in job descriptions.
        listeners: progress listeners (the caller's and the bar's), called on driver threads.
        score_listeners: called with each [`ScoreReport`][torchspark.training.ScoreReport] workers send.
        attempt: which launch of the workers this is (0 first; each recovery adds one). Runners name everything
            an attempt's workers read by it (rendezvous keys, job descriptions), and each attempt has its own
            progress server and token, so nothing a failed attempt left behind is read by the next.
        stall_timeout_s: the master's ``stall_timeout_s``: the watchdog fails the attempt when no worker reported a
            new step for this long ([`stall`][torchspark.training.driver.stall]); None: no progress watchdog.
    """

    def __init__(
        self,
        network: Network,
        recorder: PhaseRecorder,
        description: str,
        listeners: Sequence[Callable[[ProgressUpdate], None]] = (),
        score_listeners: Sequence[Callable[[ScoreReport], None]] = (),
        attempt: int = 0,
        stall_timeout_s: float | None = None,
    ) -> None:
        self.network = network
        self.recorder = recorder
        self.attempt = attempt
        self.stall_timeout_s = stall_timeout_s
        self.description = description if attempt == 0 else f"{description} (attempt {attempt})"
        self._listeners = list(listeners)
        self._score_listeners = list(score_listeners)
        self._server: ProgressServer | DirectoryProgressReader | None = None
        self._stall = ProgressStall(stall_timeout_s)

    def progress_address(
        self, host: str = "127.0.0.1", advertise_host: str | None = None, port_range: tuple[int, int] | None = None
    ) -> ProgressEndpoint:
        """Start the progress server on ``host`` (once per fit; on a port inside ``port_range`` when set, the mesh
        option) and return the address workers dial."""
        if self._server is None:
            self._server = listen_in_range(
                lambda port: ProgressServer(
                    host=host,
                    port=port,
                    advertise_host=advertise_host,
                    listeners=self._listeners,
                    score_listeners=self._score_listeners,
                ).start(),
                port_range,
                "the driver's progress server",
            )
        assert isinstance(self._server, ProgressServer), "one progress channel per fit"
        return self._server.endpoint

    def progress_directory(self, base: str, poll_s: float = 1.0, flush_s: float = 1.0) -> ProgressDirectory:
        """Start polling a fresh directory under ``base`` (once per attempt: ``base/fit-<id>-a<attempt>``) and return
        where workers write (`torchspark.training.progress.files`): the channel for a driver the executors
        cannot connect to. After a fit that succeeded the directory is removed; after a failure it stays."""
        if self._server is None:
            url = join(base, f"fit-{uuid.uuid4().hex[:12]}-a{self.attempt}")
            self._server = DirectoryProgressReader(
                url, poll_s, flush_s, listeners=self._listeners, score_listeners=self._score_listeners
            ).start()
        assert isinstance(self._server, DirectoryProgressReader), "one progress channel per fit"
        return self._server.target

    def reported_errors(self) -> list[tuple[int, str]]:
        return self._server.errors() if self._server is not None else []

    def stalled(self, world_size: int, timeout_s: float) -> WorkerLost | None:
        """The watchdog: a [`WorkerLost`][torchspark.errors.WorkerLost] when a rank stopped sending heartbeats for ``timeout_s``, or every
        rank finished but the runner still waits ``timeout_s`` later (`torchspark.training.progress.liveness`),
        or no rank reported a new step for ``stall_timeout_s`` ([`stall`][torchspark.training.driver.stall]); None while
        all is well or without a progress server."""
        if self._server is None:
            return None
        lost = self._server.liveness.stalled(world_size, timeout_s)
        if lost is not None:  # one silent rank is the more precise verdict
            return lost
        return self._stall.check(world_size, self._server.latest(), self._server.liveness.snapshot())

    def worker_pids(self) -> dict[int, int | None]:
        """Each rank's process id as its progress connection reported it (ranks not heard from are missing)."""
        if self._server is None:
            return {}
        return {rank: state.pid for rank, state in self._server.liveness.snapshot().items()}

    def suspect(self) -> int | None:
        """The rank most likely lost when the error does not say: of the ranks that reported no error, the one
        whose progress connection closed first (a killed process's socket closes at once); on the directory
        channel, the one whose files stopped first without a ``closed`` line."""
        if self._server is None:
            return None
        reporting = {rank for rank, _ in self._server.errors()}
        states = self._server.liveness.snapshot().items()
        if isinstance(self._server, DirectoryProgressReader):  # a killed worker never writes "closed": the rank
            # that went silent first is the lost one
            silent = [(s.last_seen, r) for r, s in states if not s.ended and r not in reporting]
            return min(silent)[1] if silent else None
        ended = [(s.last_seen, r) for r, s in states if s.ended and r not in reporting]
        return min(ended)[1] if ended else None

    def reached(self) -> tuple[int, int] | None:
        """``(epoch, iteration within it)`` the furthest worker reported (None: no progress heard)."""
        latest = self._server.latest() if self._server is not None else {}
        return max(((u.epoch, u.iteration) for u in latest.values()), default=None)

    def notify(self, update: ProgressUpdate) -> None:
        for fn in self._listeners:
            try:
                fn(update)
            except Exception:  # a broken display must never stop training
                log.warning("a progress listener failed", exc_info=True)

    def close(self, drain_s: float = 0.0, succeeded: bool = False) -> None:
        """Close the progress channel; ``drain_s`` > 0 first reads what workers that have ended sent last.
        ``succeeded`` removes a directory channel's files (a failed attempt's stay for reading)."""
        if isinstance(self._server, DirectoryProgressReader):
            self._server.close(drain_s=drain_s, remove=succeeded)
        elif self._server is not None:
            self._server.close(drain_s=drain_s)
