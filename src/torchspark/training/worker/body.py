"""The one executor-side body of a worker (`worker_main`): every runner sets up a rank here and nowhere else.

A runner describes where its rank runs and how it meets its peers and reports as a `WorkerEnv`, what the rank does
as a work callable (`train` for a fit), and calls `worker_main` (docs/design.md, "Where a worker runs").
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from torchspark.training.comm import Communicator, SoloCommunicator
from torchspark.training.hooks import WorkerHooks
from torchspark.training.progress import ProgressDirectory, ProgressEndpoint
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask
from torchspark.training.worker.devices import task_thread_settings
from torchspark.training.worker.loop import run_worker
from torchspark.training.worker.reporting import open_worker_hooks

__all__ = ["WorkerEnv", "RankSetup", "Rendezvous", "worker_main", "train", "solo"]

R = TypeVar("R")

#: how a rank meets its peers: given its device, the communicator and what it chose on the network (an address,
#: interface, backend... as ``WorkerResult.network`` reports it; None when there is nothing to report)
Rendezvous = Callable[[str], "tuple[Communicator, dict[str, Any] | None]"]


def solo(device: str) -> tuple[Communicator, dict[str, Any] | None]:
    """The rendezvous of a rank without peers (a world of one, or the rounds route: the driver averages)."""
    return SoloCommunicator(), None


@dataclass(frozen=True)
class WorkerEnv:
    """Where a rank runs and how its runner rendezvouses and reports.

    Args:
        rank: this worker's rank.
        device: its torch device (``"cpu"``, ``"cuda:1"``); a CUDA device becomes this process's current one.
        threads: torch intra-op threads while the work runs (a Spark task's cores); None leaves them. A task's own
            ``num_threads`` still wins inside `run_worker`.
        flush_denormal: flush denormal floats to zero while the work runs (restored after).
        rendezvous: how the rank meets its peers (`Rendezvous`; default `solo`). Called after the hooks are open.
        progress: the driver's progress channel (its endpoint, or the directory it polls); None: no channel.
        collect_stats: record the rank's phases in a stats collector (on the driver's clock when there is a channel).
        report_scores: send the averaged score after each round / epoch over the channel (rank 0).
        hooks: builds the rank's hooks instead (``InProcessRunner(hooks_factory=...)``); gets the rank.
        on_error: receives ``(rank, traceback)`` of a failure, which `worker_main` then swallows (it returns
            None): for runners that collect errors themselves (a results queue, a list). None: the traceback goes
            over the progress channel (``hooks.report_error``) and the exception propagates (a Spark task fails
            its stage).
        placement: the GPU addresses Spark assigned to the task and its executor, reported in the result (None: the
            runner reports no placement).
    """

    rank: int
    device: str = "cpu"
    threads: int | None = None
    flush_denormal: bool = False
    rendezvous: Rendezvous = solo
    progress: ProgressEndpoint | ProgressDirectory | None = None
    collect_stats: bool = False
    report_scores: bool = False
    hooks: Callable[[int], WorkerHooks] | None = None
    on_error: Callable[[int, str], None] | None = None
    placement: tuple[tuple[str, ...], str] | None = None

    def where(self) -> dict[str, Any]:
        """Where the rank ran, as `WorkerResult` fields (``device``, ``gpu_addresses``, ``executor``); empty when
        the runner reports no placement."""
        if self.placement is None:
            return {}
        return {"device": self.device, "gpu_addresses": self.placement[0], "executor": self.placement[1]}


@dataclass(frozen=True)
class RankSetup:
    """A set-up rank: what the work callable of `worker_main` receives.

    Attributes:
        env: the rank's `WorkerEnv` (rank, device, placement).
        comm: its communicator, connected to its peers; hooks: its stats recorder and progress (`worker_main`
            closes both).
        network: what the rendezvous chose on the network (None: nothing to report).
    """

    env: WorkerEnv
    comm: Communicator
    hooks: WorkerHooks
    network: dict[str, Any] | None = None


def worker_main(env: WorkerEnv, work: Callable[[RankSetup], R]) -> R | None:
    """Set up the rank ``env`` describes, run ``work`` on it, report a failure, close everything.

    In order: make a CUDA device current; open the hooks (``env.hooks``, else the progress channel and stats of
    `open_worker_hooks`); rendezvous (``env.rendezvous``); run ``work(rank)`` under the rank's thread settings
    (``env.threads``, ``env.flush_denormal``, restored after: a reused Spark Python worker runs other tasks next);
    then close the communicator and the hooks, whatever happened.

    Contract of ``work``: it receives the set-up `RankSetup` and returns the rank's result, which `worker_main`
    returns; it must not close the communicator or the hooks. A failure anywhere (hooks, rendezvous, work) is
    reported with its traceback: to ``env.on_error`` (then None is returned), else over the progress channel and
    re-raised.
    """
    hooks: WorkerHooks | None = None
    comm: Communicator | None = None
    try:
        if env.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(env.device))
        if env.hooks is not None:
            hooks = env.hooks(env.rank)
        else:
            hooks = open_worker_hooks(env.rank, env.collect_stats, env.progress, report_scores=env.report_scores)
        comm, network = env.rendezvous(env.device)
        with task_thread_settings(env.threads, env.flush_denormal):
            return work(RankSetup(env, comm, hooks, network))
    except BaseException:
        trace = traceback.format_exc()
        if env.on_error is not None:
            env.on_error(env.rank, trace)
            return None
        if hooks is not None and hooks.report_error is not None:
            hooks.report_error(trace)
        raise
    finally:
        if comm is not None:
            comm.close()
        if hooks is not None and hooks.close is not None:
            hooks.close()


def train(task: WorkerTask, source: EpochSource) -> Callable[[RankSetup], WorkerResult]:
    """The work of a fit's rank: [`run_worker`][torchspark.training.run_worker] on ``source``, its result
    carrying where the rank ran (the rendezvous' choices, the device and placement, when the runner reports them).

    Example: ``worker_main(WorkerEnv(0), train(task, ItemSource(batches)))`` trains one rank alone."""

    def run(rank: RankSetup) -> WorkerResult:
        result = run_worker(task, source, rank.comm, rank.env.device, rank.hooks)
        where = rank.env.where()
        return replace(result, network=rank.network, **where) if where else result

    return run
