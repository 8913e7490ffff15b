"""Running ``run_worker`` inside a Spark barrier stage: rendezvous, device choice, and driver-side supervision.

Worker side (:func:`barrier_task`): task 0 hosts a ``TCPStore`` on a free port and publishes its address
through a relay store on the driver (:func:`open_relay`; ``BarrierTaskContext.allGather`` without one, bounded by
``rendezvous_timeout_s`` on any session: :mod:`torchspark.spark.barrier_wait`), and all
of them build a torch.distributed group (gloo on CPU, nccl on CUDA) with ``rendezvous_timeout_s`` as the collective timeout.

Driver side (:func:`run_barrier_stage`): runs the stage under its own job group, cancels it on failure or
Ctrl-C, and turns a worker exception into a :class:`WorkerError` carrying the worker's traceback.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import subprocess
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch

from torchspark.errors import ConfigError, SetupError, TorchSparkError, WaitTimeout, WorkerError
from torchspark.spark.barrier_wait import wait_bounded
from torchspark.training import env as task_env
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.devices import backend_for_device, device_for_task, gpu_addresses
from torchspark.training.progress import ProgressEndpoint
from torchspark.training.reporting import open_worker_hooks
from torchspark.training.runner import is_peer_failure, root_cause, traceback_tail
from torchspark.training.stores import fetch, listening_store, private_store, publish
from torchspark.training.worker import ItemSource, WorkerResult, WorkerTask, run_worker

__all__ = ["RendezvousSettings", "barrier_task", "open_relay", "run_barrier_stage", "run_in_job_group", "LOCAL_ADDRESS_ENV",
           "pick_local_address"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a worker tries to connect to the driver's rendezvous store before failing with advice.
RELAY_CONNECT_TIMEOUT_S = 60.0

#: Overrides the address a worker advertises to its peers (DL4J's ``DL4J_VOID_IP``).
LOCAL_ADDRESS_ENV = "TORCHSPARK_LOCAL_IP"


@dataclass(frozen=True)
class RendezvousSettings:
    """How workers find each other.

    Args:
        timeout_s: limit for every rendezvous and collective wait (``rendezvous_timeout_s``).
        port: TCP port task 0 listens on; 0 picks a free one.
        network_mask: CIDR such as ``"10.0.0.0/16"``: advertise the local interface address inside it
            (needed on hosts with several interfaces, e.g. YARN or EC2).
        controller_address: a fixed address for task 0 to advertise (overrides the mask).
        shared_memory: let workers on one host sum through ``/dev/shm`` (see :mod:`torchspark.training.shm`).
    The environment variable ``TORCHSPARK_LOCAL_IP`` on an executor overrides the address it advertises.
    """

    timeout_s: float = 300.0
    port: int = 0
    network_mask: str | None = None
    controller_address: str | None = None
    shared_memory: bool = True

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0):
            raise ConfigError(f"rendezvous_timeout_s must be > 0, got {self.timeout_s!r}")
        if not (0 <= int(self.port) <= 65535):
            raise ConfigError(f"port must be in [0, 65535] (0 = any free port), got {self.port!r}")
        if self.network_mask is not None:
            try:
                ipaddress.ip_network(self.network_mask, strict=False)
            except ValueError as e:
                raise ConfigError(f"network_mask must be a CIDR such as '10.0.0.0/16', got {self.network_mask!r}") from e


def _interface_addresses() -> list[str]:
    addrs: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addrs.add(str(info[4][0]))
    except OSError:
        pass
    try:  # Linux: every configured IPv4 address
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
        addrs.update(a for a in out.split() if "." in a)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    addrs.add("127.0.0.1")
    return sorted(addrs)


def pick_local_address(task_host: str, settings: RendezvousSettings, env: dict[str, str] | None = None,
                       candidates: list[str] | None = None) -> str:
    """The address this task advertises: env override, then controller address, then mask match, then Spark's."""
    env = os.environ if env is None else env
    if env.get(LOCAL_ADDRESS_ENV):
        return env[LOCAL_ADDRESS_ENV]
    if settings.controller_address:
        return settings.controller_address
    if settings.network_mask:
        net = ipaddress.ip_network(settings.network_mask, strict=False)
        for addr in candidates if candidates is not None else _interface_addresses():
            if ipaddress.ip_address(addr) in net:
                return addr
        raise SetupError(
            f"no local interface address is inside network_mask={settings.network_mask!r} on {socket.gethostname()}"
            f"; fix the mask or set {LOCAL_ADDRESS_ENV} on the executors"
        )
    return task_host


def open_relay(advertise_host: str, timeout_s: float, bind_host: str | None = None) -> tuple[Any, tuple[str, int]]:
    """A small key-value store on the driver through which task 0 tells its peers where its store listens.

    Spark's ``BarrierTaskContext.allGather`` would do, but it polls once a second on the JVM side, which costs
    about one second per fit; a ``TCPStore`` ``get`` returns the moment the key is set. Executors must reach the
    driver on this port, as they already must for the progress channel. It listens on ``bind_host`` (default
    ``advertise_host``) only; the key and value are derived from and signed with the fit's token
    (:mod:`torchspark.training.stores`). Keep the returned store referenced for the whole fit; dropping it closes
    the port.
    """
    store = listening_store(bind_host or advertise_host, 0, None, timeout_s)
    return store, (advertise_host, int(store.port))


def _publish_address(ctx: Any, rank: int, world: int, message: str, relay_address: tuple[str, int] | None,
                     timeout: Any, token: bytes) -> str:
    """Task 0's ``host:port`` on every task: through the driver's relay store, else Spark's allGather."""
    import datetime

    import torch.distributed as dist

    if relay_address is None:
        # bounded here: Spark's own limit (spark.barrier.sync.timeout) is a session setting, 365 days by default
        try:
            gathered = wait_bounded(lambda: ctx.allGather(message), timeout.total_seconds(),
                                    f"worker {rank} of {world} in Spark's barrier allGather")
        except WaitTimeout:
            raise
        except Exception as e:  # py4j/Spark errors carry no stable type
            raise WaitTimeout(
                f"barrier allGather failed or timed out ({e}); all {world} tasks must start together: check free "
                "task slots and raise spark.barrier.sync.timeout / rendezvous_timeout_s if executors start slowly"
            ) from e
        return str(gathered[0])
    host, port = relay_address
    connect_s = min(timeout.total_seconds(), RELAY_CONNECT_TIMEOUT_S)
    try:
        relay = dist.TCPStore(host, int(port), None, is_master=False, timeout=datetime.timedelta(seconds=connect_s))
    except (RuntimeError, OSError) as e:
        raise WaitTimeout(
            f"worker {rank} could not reach the driver's rendezvous store at {host}:{port} within {connect_s:.0f} s "
            f"({e}). Open that port from the executors to the driver (spark.driver.host), or set "
            "rendezvous_via='barrier' on the training master to rendezvous through Spark instead"
        ) from e
    relay.set_timeout(timeout)
    try:
        if rank == 0:
            publish(relay, token, _STORE_ADDRESS, message)
            return message
        return fetch(relay, token, _STORE_ADDRESS)
    except (RuntimeError, OSError) as e:
        raise WaitTimeout(
            f"worker 0 did not publish its address on the driver within rendezvous_timeout_s="
            f"{timeout.total_seconds():.0f} ({e}); it failed to start or is very slow to start"
        ) from e


#: what the relay holds: worker 0's store address (the key is derived from this and the fit's token)
_STORE_ADDRESS = "worker-0-store"


def _rendezvous(ctx: Any, settings: RendezvousSettings, backend: str, device: str,
                relay_address: tuple[str, int] | None = None, token: bytes | None = None,
                environment: task_env.TaskEnvironment | None = None) -> TorchDistCommunicator:
    import datetime

    import torch.distributed as dist

    from torchspark.training.auth import new_token

    if token is None and relay_address is not None:
        raise SetupError("a rendezvous through the driver's relay needs the fit's token; pass token= to barrier_task")
    # no token from the driver (allGather route): worker 0 draws one and Spark's allGather carries it to its peers
    shared_token = token is None
    rank = ctx.partitionId()
    infos = ctx.getTaskInfos()
    world = len(infos)
    task_host = infos[rank].address.rsplit(":", 1)[0]
    timeout = datetime.timedelta(seconds=settings.timeout_s)
    store: Any = None
    if rank == 0:
        host = pick_local_address(task_host, settings)
        store = listening_store(host, settings.port, world, settings.timeout_s)
        message = f"{host}:{store.port}"
        if shared_token:
            token = new_token()
            message = f"{token.hex()}@{message}"
    else:
        message = ""
    published = _publish_address(ctx, rank, world, message, relay_address, timeout, token or b"")
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
                f"{settings.timeout_s}: {e}. Executors must reach each other on that port: check firewalls, "
                f"set network_mask or {LOCAL_ADDRESS_ENV} so workers advertise an address their peers can reach"
            ) from e
    # the caller's scope restores it when the task ends (without one it stays set, as for a one-off process)
    (environment or task_env.TaskEnvironment()).setdefault(task_env.GLOO_SOCKET_IFNAME, _ifname_for(host))
    return TorchDistCommunicator(private_store(store, token), rank, world, backend, device, settings.timeout_s,
                                 settings.shared_memory)


def _ifname_for(address: str) -> str | None:
    """The loopback interface name when peers talk over loopback (gloo otherwise resolves the hostname)."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return "lo"
    except ValueError:
        return None
    return None


def barrier_task(
    task_bc: Any, settings: RendezvousSettings, progress_address: ProgressEndpoint | None = None,
    relay_address: tuple[str, int] | None = None, token: bytes | None = None,
) -> Callable[[Iterable[Any]], Iterator[WorkerResult]]:
    """The ``mapPartitions`` function of the training stage (module level: nothing hidden in a closure).

    ``relay_address`` is the driver's :func:`open_relay` store (None: rendezvous through Spark's allGather);
    ``token`` the fit's secret (default: the progress endpoint's), which names and signs the rendezvous keys.
    Environment variables the task sets are restored when it ends (PySpark reuses Python workers)."""
    if token is None and progress_address is not None:
        token = progress_address.token

    def run(items: Iterable[Any]) -> Iterator[WorkerResult]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        task: WorkerTask = task_bc.value
        device = device_for_task(gpu_addresses(ctx.resources()), task_env.read(task_env.CUDA_VISIBLE_DEVICES),
                                 torch.cuda.is_available())
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        cpus = ctx.cpus() if hasattr(ctx, "cpus") else 1
        task = _with_threads(task, cpus)
        hooks = open_worker_hooks(ctx.partitionId(), task.collect_stats, progress_address)
        comm: TorchDistCommunicator | None = None
        environment = task_env.TaskEnvironment()
        try:
            comm = _rendezvous(ctx, settings, backend_for_device(device), device, relay_address, token, environment)
            result = run_worker(task, ItemSource(items), comm, device, hooks)
        except BaseException:
            if hooks.report_error is not None:
                hooks.report_error(traceback.format_exc())
            raise
        finally:
            if comm is not None:
                comm.close()
            environment.restore()
            if hooks.close is not None:
                hooks.close()
        yield result

    return run


def _with_threads(task: WorkerTask, cpus: int) -> WorkerTask:
    from dataclasses import replace

    return task if task.num_threads else replace(task, num_threads=max(1, int(cpus)))


_PY_TRACE = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\n\s*at org\.apache|\Z)", re.S)


def worker_traceback(error: BaseException) -> str:
    """The Python traceback of a failed task, dug out of Spark's Java exception text."""
    text = str(error)
    found = _PY_TRACE.findall(text)
    tb = found[-1] if found else text
    return "\n".join(ln for ln in tb.strip().splitlines() if not ln.strip().startswith("SQLSTATE"))


def _pick_traceback(spark_tb: str, reported_errors: Callable[[], list[tuple[int, str]]] | None,
                    wait_s: float = 3.0) -> str:
    """Spark's traceback unless it is a peer's symptom and a worker reported the cause over the progress channel."""
    if reported_errors is None or not is_peer_failure(spark_tb):
        return spark_tb
    deadline = time.monotonic() + wait_s
    while True:
        found = root_cause(reported_errors())
        if found is not None and not is_peer_failure(found[1]):
            return found[1]
        if time.monotonic() >= deadline:
            return spark_tb
        time.sleep(0.05)


def _root_message(tb: str) -> str:
    lines = [ln for ln in tb.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else tb


def run_in_job_group(sc: Any, description: str, action: Callable[[], T], thread_name: str = "torchspark-job") -> T:
    """Run ``action`` (which submits Spark jobs) on a helper thread under a fresh job group and return its value.

    Ctrl-C (or any exception) on the calling thread cancels the group and waits up to 60 s for the thread; an
    exception raised by ``action`` cancels the group and is re-raised unchanged on the calling thread.
    """
    group = f"torchspark-{uuid.uuid4().hex[:12]}"
    box: dict[str, Any] = {}
    # wait on an Event, not Thread.join: a Ctrl-C inside join() marks the still-running thread as stopped (CPython
    # bpo-45274 handling), after which join() no longer waits for it
    done = threading.Event()

    def target() -> None:
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            box["value"] = action()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            box["error"] = e
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            done.set()

    thread = threading.Thread(target=target, name=thread_name, daemon=True)
    thread.start()
    try:
        while not done.wait(timeout=0.1):
            pass
    except BaseException:
        sc.cancelJobGroup(group)
        if not done.wait(timeout=60):
            log.warning("the cancelled job %r did not stop within 60 s; it is left to Spark", description)
        raise
    if "error" in box:
        sc.cancelJobGroup(group)
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def run_barrier_stage(sc: Any, rdd: Any, fn: Callable[[Iterable[Any]], Iterator[WorkerResult]],
                      description: str,
                      reported_errors: Callable[[], list[tuple[int, str]]] | None = None) -> list[WorkerResult]:
    """Run ``fn`` as a barrier stage over ``rdd`` under a fresh job group; cancel it and re-raise on failure.

    Spark reports whichever task failed first, which is often a peer that merely saw the failing worker's
    connection drop. ``reported_errors`` (the progress channel's error list) lets the driver show the root cause.
    """
    try:
        results: list[WorkerResult] = run_in_job_group(
            sc, description, lambda: rdd.barrier().mapPartitions(fn).collect(), "torchspark-barrier-stage")
    except TorchSparkError:
        raise
    except Exception as err:  # Spark/py4j errors carry no stable type
        tb = _pick_traceback(worker_traceback(err), reported_errors)
        raise WorkerError(
            f"a training worker failed: {_root_message(tb)}\n--- worker traceback ---\n{traceback_tail(tb)}"
        ) from None
    return sorted(results, key=lambda r: r.rank)
