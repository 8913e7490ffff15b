"""The worker side of the Spark barrier stage: the task's `WorkerEnv` (`barrier_env`) and its rendezvous, for the
one worker body (`torchspark.training.worker.body.worker_main`).

Task 0 hosts a ``TCPStore`` and publishes its address through the driver's relay store (`open_relay`) or Spark's
``allGather`` (bounded by ``rendezvous_timeout_s`` on any session: `torchspark.spark.barrier_wait`); the workers
agree on a backend through that store (`choose_backend`) and build a torch.distributed group (`rendezvous`). The
driver side (the stage's job group, a worker's exception as our error) is `torchspark.spark.jobs.run_barrier_stage`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from torchspark.errors import SetupError, WaitTimeout
from torchspark.spark.barrier_wait import wait_bounded
from torchspark.spark.task_bootstrap import set_up_task
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.progress import ProgressDirectory, ProgressEndpoint
from torchspark.training.rendezvous.netif import LOCAL_ADDRESS_ENV, Endpoint, choose_endpoint, socket_interface
from torchspark.training.rendezvous.ports import listen_in_range
from torchspark.training.rendezvous.relay import RelayLimits, RelayServer
from torchspark.training.rendezvous.relay_client import relay_get, relay_set
from torchspark.training.rendezvous.stores import listening_store, private_store
from torchspark.training.task import WorkerResult, WorkerTask
from torchspark.training.worker.body import WorkerEnv, train, worker_main
from torchspark.training.worker.devices import agree_backend, gpu_identity
from torchspark.training.worker.loop import ItemSource

__all__ = [
    "barrier_task",
    "barrier_env",
    "open_relay",
    "relay_key",
    "rendezvous",
    "LOCAL_ADDRESS_ENV",
]

log = logging.getLogger(__name__)


def _store_address(local: Endpoint, settings: MeshConfig) -> str:
    """The address worker 0's store advertises: ``controller_address`` (e.g. a NAT address) unless
    ``TORCHSPARK_LOCAL_IP`` forced one, else the local choice. Host identity and gloo keep the local one."""
    if settings.controller_address and local.source != "env":
        return settings.controller_address
    return local.address


def open_relay(
    advertise_host: str,
    timeout_s: float,
    port_range: tuple[int, int] | None = None,
    bind_host: str | None = None,
    *,
    token: bytes,
) -> tuple[RelayServer, tuple[str, int]]:
    """A small key-value store on the driver through which task 0 tells its peers where its store listens.

    Spark's ``BarrierTaskContext.allGather`` would do, but it polls once a second on the JVM side, which costs
    about one second per fit; a relay ``get`` returns the moment the key is set. Executors must reach the
    driver on this port, as they already must for the progress channel. It listens on ``bind_host`` (default
    ``advertise_host``) only and serves only clients that prove ``token`` (the fit's), with capped values and
    no wait without a deadline (`RelayServer`). Close the returned
    server when the stage ends. ``timeout_s`` (``rendezvous_timeout_s``) bounds how long a connection may take to
    authenticate.
    """
    limits = RelayLimits(hello_timeout_s=min(timeout_s, RelayLimits().hello_timeout_s))
    server = listen_in_range(
        lambda port: RelayServer(bind_host or advertise_host, port, token=token, limits=limits).start(),
        port_range,
        "the driver's rendezvous relay",
    )
    return server, (advertise_host, server.port)


def _publish_address(
    ctx: Any,
    rank: int,
    world: int,
    message: str,
    relay_address: tuple[str, int] | None,
    timeout: Any,
    token: bytes,
    attempt: int = 0,
) -> str:
    """Task 0's ``host:port`` on every task: through the driver's relay store, else Spark's allGather."""
    if relay_address is None:
        # bounded here: Spark's own limit (spark.barrier.sync.timeout) is a session setting, 365 days by default
        try:
            gathered = wait_bounded(
                lambda: ctx.allGather(message),
                timeout.total_seconds(),
                f"worker {rank} of {world} in Spark's barrier allGather",
            )
        except WaitTimeout:
            raise
        except Exception as e:  # py4j/Spark errors carry no stable type
            raise WaitTimeout(
                f"barrier allGather failed or timed out ({e}); all {world} tasks must start together: check free "
                "task slots and raise spark.barrier.sync.timeout / rendezvous_timeout_s if executors start slowly"
            ) from e
        return str(gathered[0])
    key = relay_key(attempt, int(ctx.stageId()))
    if rank == 0:
        relay_set(relay_address, token, key, message, timeout.total_seconds())
        return message
    try:
        return relay_get(relay_address, token, key, timeout.total_seconds())
    except WaitTimeout as e:
        raise WaitTimeout(
            f"worker {rank} of {world}: worker 0 did not publish its address on the driver's rendezvous relay within "
            f"rendezvous_timeout_s={timeout.total_seconds():.0f}; it failed to start or is very slow to start ({e})"
        ) from e


#: what the relay holds: worker 0's store address
_STORE_ADDRESS = "worker-0-store"


def relay_key(attempt: int, stage_id: int) -> str:
    """The relay key worker 0 publishes its address under: named by the driver's recovery attempt and Spark's
    stage, so a relaunched stage never reads the address of a worker 0 that a failed one started."""
    return f"{_STORE_ADDRESS}/attempt-{attempt}/stage-{stage_id}"


def rendezvous(
    ctx: Any,
    settings: MeshConfig,
    device: str,
    relay_address: tuple[str, int] | None = None,
    driver_host: str | None = None,
    token: bytes | None = None,
    attempt: int = 0,
) -> tuple[TorchDistCommunicator, dict[str, Any]]:
    """Build the process group of a barrier task; returns it and what this worker chose (address, interface,
    source, the backend the workers agreed on: nccl when every worker has a GPU of its own, else gloo).

    Task 0 hosts a ``TCPStore`` and publishes its address through the driver's relay store at ``relay_address``
    (its clients prove ``token``), or, with ``relay_address=None``, through Spark's ``BarrierTaskContext.allGather`` (then
    worker 0 draws the token and the gather carries it: no connection to the driver at all, as the Spark Connect
    route needs). ``attempt`` names the relay keys of a recovery attempt."""
    import datetime

    import torch.distributed as dist

    from torchspark.training.rendezvous.auth import new_token

    if token is None and relay_address is not None:
        raise SetupError("a rendezvous through the driver's relay needs the fit's token; pass token= to barrier_task")
    # no token from the driver (allGather route): worker 0 draws one and Spark's allGather carries it to its peers
    shared_token = token is None
    rank = ctx.partitionId()
    infos = ctx.getTaskInfos()
    world = len(infos)
    task_host = infos[rank].address.rsplit(":", 1)[0]
    timeout = datetime.timedelta(seconds=settings.rendezvous_timeout_s)
    me = choose_endpoint(driver_host, task_host, settings.network_mask)
    store: Any = None
    if rank == 0:
        advertised = _store_address(me, settings)
        store = listen_in_range(
            lambda port: listening_store(advertised, port, world, settings.rendezvous_timeout_s),
            settings.port_range,
            "worker 0's rendezvous store",
            settings.port,
        )
        message = f"{advertised}:{store.port}"
        if shared_token:
            token = new_token()
            message = f"{token.hex()}@{message}"
    else:
        message = ""
    published = _publish_address(ctx, rank, world, message, relay_address, timeout, token or b"", attempt)
    if shared_token:
        token_hex, published = published.split("@", 1)
        token = bytes.fromhex(token_hex)
    assert token is not None
    host, port = published.rsplit(":", 1)
    if rank != 0:
        try:
            store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
        except (RuntimeError, OSError) as e:
            raise WaitTimeout(
                f"worker {rank} could not reach task 0 at {host}:{port} within rendezvous_timeout_s="
                f"{settings.rendezvous_timeout_s}: {e}. Executors must reach each other on that port: check firewalls, "
                f"set network_mask or {LOCAL_ADDRESS_ENV} so workers advertise an address their peers can reach"
            ) from e
    backend = agree_backend(private_store(store, token), rank, world, device, gpu_identity(device, task_host)).backend
    # gloo/NCCL advertise what the hostname resolves to unless told an interface: often loopback (127.0.1.1)
    with socket_interface(me.interface) as in_effect:
        comm = TorchDistCommunicator(
            private_store(store, token),
            rank,
            world,
            backend,
            device if backend == "nccl" else "cpu",  # gloo sums in host memory
            settings.rendezvous_timeout_s,
            settings.shared_memory_allreduce,
            host_address=me.address,
        )
    chosen = {
        "address": me.address,
        "interface": me.interface,
        "source": me.source,
        "socket_ifname": in_effect.get("GLOO_SOCKET_IFNAME"),
        "shared_memory": comm.uses_shared_memory,
        "store": f"{host}:{port}",
        "backend": backend,
    }
    return comm, chosen


def barrier_task(
    task_bc: Any,
    settings: MeshConfig,
    progress_address: ProgressEndpoint | None = None,
    relay_address: tuple[str, int] | None = None,
    token: bytes | None = None,
    gpu_dry_run: bool = False,
) -> Callable[[Iterable[Any]], Iterator[WorkerResult]]:
    """The ``mapPartitions`` function of the training stage (module level: nothing hidden in a closure).

    ``relay_address`` is the driver's `open_relay` store (None: rendezvous through Spark's allGather);
    ``token`` the fit's secret (default: the progress endpoint's), which names and signs the rendezvous keys;
    ``gpu_dry_run`` the testing aid of `dry_run_requested`. Each result carries the
    worker's device, the GPU addresses Spark assigned to its task and its executor.
    Environment variables the task sets are restored when it ends (PySpark reuses Python workers)."""
    if token is None and progress_address is not None:
        token = progress_address.token
    driver_host = _driver_host(relay_address, progress_address)

    def run(items: Iterable[Any]) -> Iterator[WorkerResult]:
        from pyspark import BarrierTaskContext

        ctx, task = BarrierTaskContext.get(), task_bc.value
        env = barrier_env(ctx, task, settings, progress_address, gpu_dry_run, relay_address, driver_host, token)
        yield cast(WorkerResult, worker_main(env, train(task, ItemSource(items))))

    return run


def barrier_env(
    ctx: Any,
    task: WorkerTask,
    settings: MeshConfig,
    progress: ProgressEndpoint | ProgressDirectory | None,
    gpu_dry_run: bool = False,
    relay_address: tuple[str, int] | None = None,
    driver_host: str | None = None,
    token: bytes | None = None,
) -> WorkerEnv:
    """The `WorkerEnv` of a barrier task (classic or Connect): the task's device, cores and placement, `rendezvous`
    as its strategy, the fit's progress channel; errors go over that channel and fail the stage."""
    return set_up_task(ctx, gpu_dry_run).worker_env(
        ctx.partitionId(),
        rendezvous=lambda device: rendezvous(ctx, settings, device, relay_address, driver_host, token, task.attempt),
        progress=progress,
        collect_stats=task.collect_stats,
        report_scores=task.report_scores,
    )


def _driver_host(*addresses: tuple[Any, ...] | None) -> str | None:
    """The driver's host as the executors dial it (the relay's or the progress server's advertised host)."""
    return next((a[0] for a in addresses if a is not None), None)
