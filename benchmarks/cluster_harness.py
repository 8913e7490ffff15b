"""A real multi-host Spark standalone cluster on one Linux machine, built from network namespaces.

Every "host" is a network namespace with its own IPv4 address on a bridge in the root namespace, its own
hostname (which, as on Debian's ``127.0.1.1`` entry, resolves to loopback), and a second *decoy* interface that
leads nowhere: a worker that advertises the decoy, the hostname or loopback to its peers cannot be reached. The
Spark master runs in the root namespace on the bridge address; one Spark worker runs in each namespace
(pyspark's bundled ``bin/spark-class``). Namespaces share the filesystem, so an export directory under ``/tmp``
is seen by every host; they also share ``/dev/shm``, which is exactly what a "same host?" check must not trust.

Layout of instance ``X`` (picked free, so two instances can coexist)::

    root namespace:  bridge tsbX  198.18.X.1/24   Spark master (spark://198.18.X.1:<port>) and the driver
    namespace tsXh1: eth0 198.19.X.11/24 (decoy, first in every list)   eth1 198.18.X.11/24 (bridge)  hostname tsXhost1
    namespace tsXh2: eth0 198.19.X.12/24 (decoy)                        eth1 198.18.X.12/24           hostname tsXhost2
    ...

Usage (root and ``ip netns`` needed; :func:`unavailable_reason` says why not)::

    with NetnsCluster(workers=2) as cluster:
        spark = cluster.session("my-app")              # a driver in this process (one SparkContext per process)
        ...
        out = cluster.run_driver(["script.py", "arg"])  # or a driver in a fresh interpreter
        cluster.shape_links("100mbit", "0.5ms")        # tc tbf (+ netem when the kernel has it) on every link

Everything is torn down on exit of the ``with`` block, on :meth:`NetnsCluster.stop`, and at interpreter exit
(``atexit``): Spark processes (by process group and by namespace), namespaces, veths, the bridge and the
``/etc/netns/<name>`` files. :func:`cleanup_stale` removes what a killed run left behind.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchspark._process import is_running

if TYPE_CHECKING:
    from torchspark.spark.connect import ConnectServer

__all__ = [
    "Host",
    "NetnsCluster",
    "HarnessError",
    "unavailable_reason",
    "cleanup_stale",
    "spark_home",
    "netem_available",
    "client_netns_name",
]

log = logging.getLogger(__name__)

#: bridge subnets are 198.18.X.0/24, decoys 198.19.X.0/24 (RFC 2544 benchmarking range)
_BRIDGE_NET = "198.18"
_DECOY_NET = "198.19"
_PREFIX = "ts"  # every object name starts with ts<X>; names stay within IFNAMSIZ (15)
_STATE_DIR = "/run/torchspark-netns"


class HarnessError(RuntimeError):
    """The cluster could not be built or did not come up in time (message says what and where the logs are)."""


@dataclass(frozen=True)
class Host:
    """One namespace "host"."""

    index: int  # 1-based
    netns: str  # network namespace name
    hostname: str  # its UTS hostname (resolves to 127.0.1.1 inside the namespace)
    address: str  # on the bridge: the address every peer must use
    decoy_address: str  # on the decoy interface: must never be advertised
    interface: str = "eth1"
    decoy_interface: str = "eth0"
    root_veth: str = ""  # the bridge-side end in the root namespace (for tc)


def spark_home() -> str:
    """pyspark's installation directory, which bundles ``bin/spark-class`` and the jars."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise HarnessError("pyspark is not installed in this interpreter")
    return os.path.dirname(spec.origin)


def _run(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """None when this machine can build a cluster, else why not (used as a pytest skip reason)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    for tool in ("ip", "unshare", "java"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not on PATH"
    probe = f"{_PREFIX}probe{os.getpid() % 100000}"
    try:
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"'ip netns add' does not work here: {made.stderr.strip()}"
        veth = _run(
            "ip", "link", "add", probe[:15], "type", "veth", "peer", "name", "eth1", "netns", probe, check=False
        )
        if veth.returncode != 0:
            return f"cannot create veth pairs here: {veth.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"'ip netns' does not work here: {e}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
        _run("ip", "link", "del", probe[:15], check=False)
    try:
        spark_home()
    except HarnessError as e:
        return str(e)
    return None


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (link delay); some VM kernels ship tbf but not netem."""
    probe = f"{_PREFIX}nq{os.getpid() % 100000}"[:15]
    if _run("ip", "link", "add", probe, "type", "veth", "peer", "name", probe[:-1] + "p", check=False).returncode:
        return False
    try:
        return _run("tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False).returncode == 0
    finally:
        _run("ip", "link", "del", probe, check=False)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    return is_running(pid, None)  # no start time recorded: a pid that exists counts as alive


def cleanup_stale() -> list[int]:
    """Tear down instances whose owning process is gone (a run killed with SIGKILL); returns their numbers."""
    removed: list[int] = []
    if not os.path.isdir(_STATE_DIR):
        return removed
    for name in os.listdir(_STATE_DIR):
        path = os.path.join(_STATE_DIR, name)
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if _pid_alive(int(state.get("owner", 0))):
            continue
        _teardown_objects(int(state["instance"]), int(state["hosts"]))
        os.unlink(path)
        removed.append(int(state["instance"]))
    return removed


def _netns_name(x: int, i: int) -> str:
    return f"{_PREFIX}{x}h{i}"


def client_netns_name(x: int) -> str:
    """The client namespace of instance ``x`` (``cluster_connect.ClientNamespace``); its root-side veth has the
    same name."""
    return f"{_PREFIX}{x}c"


def _teardown_objects(x: int, hosts: int) -> None:
    """Remove namespaces (killing what runs in them), veths, bridge and /etc/netns files of instance ``x``."""
    for i in range(1, hosts + 1):
        ns = _netns_name(x, i)
        pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _run("ip", "netns", "del", ns, check=False)  # takes both veth pairs with it
        for link in (f"{_PREFIX}{x}h{i}", f"{_PREFIX}{x}d{i}"):
            _run("ip", "link", "del", link, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    client = client_netns_name(x)
    for pid in _run("ip", "netns", "pids", client, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _run("ip", "netns", "del", client, check=False)
    _run("ip", "link", "del", client, check=False)
    _run("ip", "link", "del", f"{_PREFIX}b{x}", check=False)


@dataclass
class NetnsCluster:
    """A Spark standalone cluster of ``workers`` namespace hosts (see the module docstring).

    Args:
        workers: hosts, one Spark worker each (2-4 on a small machine).
        cores: ``--cores`` per worker (= training workers per host when ``spark.task.cpus`` is 1).
        memory: ``--memory`` per worker; executors get ``executor_memory`` of it.
        executor_memory: ``spark.executor.memory`` of the drivers built by :meth:`session` / :meth:`spark_conf`.
        start_timeout_s: limit for the master and every worker to come up and register.
        instance: the ``X`` of 198.18.X.0/24; None picks a free one.
        with_spark: False builds the hosts only (no master, no workers): for network tests and ``tc`` experiments.
    """

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    executor_memory: str = "768m"
    start_timeout_s: float = 120.0
    instance: int | None = None
    with_spark: bool = True
    hosts: list[Host] = field(default_factory=list, init=False)
    bridge: str = field(default="", init=False)
    bridge_ip: str = field(default="", init=False)
    master_url: str = field(default="", init=False)
    master_ui: str = field(default="", init=False)
    workdir: str = field(default="", init=False)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False, repr=False)
    _servers: list[ConnectServer] = field(
        default_factory=list, init=False, repr=False
    )  # Connect servers, stopped first
    _started: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 8:
            raise ValueError(f"workers must be in [1, 8], got {self.workers!r}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores!r}")

    # ----------------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> NetnsCluster:
        """Build the network, start the master and the workers, and wait until every worker is registered."""
        reason = unavailable_reason()
        if reason:
            raise HarnessError(f"cannot build a namespace cluster: {reason}")
        cleanup_stale()
        atexit.register(self.stop)
        self._started = True
        try:
            self._build_network()
            self.workdir = tempfile.mkdtemp(prefix=f"torchspark-cluster{self.instance}-")
            os.chmod(self.workdir, 0o755)
            if self.with_spark:
                self._start_master()
                for host in self.hosts:
                    self._start_worker(host)
                self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process and remove every network object (idempotent; also runs at interpreter exit)."""
        if not self._started:
            return
        self._started = False
        for server in self._servers:
            server.stop()
        self._servers.clear()
        for proc in reversed(self._procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 15
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait(timeout=10)
        self._procs.clear()
        if self.instance is not None:
            _teardown_objects(self.instance, self.workers)
            try:
                os.unlink(os.path.join(_STATE_DIR, str(self.instance)))
            except OSError:
                pass
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    # ------------------------------------------------------------------------------------------------- network
    def _build_network(self) -> None:
        candidates = (
            [self.instance]
            if self.instance is not None
            else list(range(20 + os.getpid() % 200, 255)) + list(range(1, 20))
        )
        for x in candidates:
            made = _run("ip", "link", "add", f"{_PREFIX}b{x}", "type", "bridge", check=False)
            if made.returncode == 0:  # the kernel makes this atomic: a second instance gets "File exists"
                self.instance = x
                break
        else:
            raise HarnessError("no free bridge name/subnet among 198.18.1-254.0/24")
        x = self.instance
        os.makedirs(_STATE_DIR, exist_ok=True)
        with open(os.path.join(_STATE_DIR, str(x)), "w") as f:
            json.dump({"instance": x, "hosts": self.workers, "owner": os.getpid()}, f)
        self.bridge = f"{_PREFIX}b{x}"
        self.bridge_ip = f"{_BRIDGE_NET}.{x}.1"
        _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.workers + 1):
            ns = _netns_name(x, i)
            host = Host(
                index=i,
                netns=ns,
                hostname=f"{_PREFIX}{x}host{i}",
                address=f"{_BRIDGE_NET}.{x}.{10 + i}",
                decoy_address=f"{_DECOY_NET}.{x}.{10 + i}",
                root_veth=f"{_PREFIX}{x}h{i}",
            )
            self.hosts.append(host)
            _run("ip", "netns", "add", ns)
            # the decoy first, so it is eth0 and listed before the real interface everywhere
            decoy_root = f"{_PREFIX}{x}d{i}"
            _run("ip", "link", "add", decoy_root, "type", "veth", "peer", "name", host.decoy_interface, "netns", ns)
            _run("ip", "link", "set", decoy_root, "up")  # up but unaddressed and unbridged: leads nowhere
            _run("ip", "link", "add", host.root_veth, "type", "veth", "peer", "name", host.interface, "netns", ns)
            _run("ip", "link", "set", host.root_veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{host.decoy_address}/24", "dev", host.decoy_interface)
            _run("ip", "-n", ns, "link", "set", host.decoy_interface, "up")
            _run("ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _run("ip", "-n", ns, "link", "set", host.interface, "up")
            # 'ip netns exec' bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: the hostname means loopback there
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.hostname}\n")

    def shape_links(self, rate: str, delay: str | None = None, burst: str = "256kb") -> None:
        """Shape both directions of every host's bridge link: ``tc`` tbf at ``rate``, then netem ``delay``.

        ``rate`` such as ``"1gbit"`` / ``"100mbit"``, ``delay`` such as ``"0.1ms"`` (one way, per direction: a
        round trip between two hosts crosses four shaped queues). Needs the kernel's ``sch_tbf`` and, for a delay,
        ``sch_netem`` (:func:`netem_available`); raises :class:`HarnessError` naming the missing one.
        ``burst``: tbf's bucket; that many bytes leave at full speed after an idle moment, so a message smaller
        than it barely sees ``rate`` (lower it, e.g. ``"16kb"``, to time small messages against the rate).
        :meth:`unshape_links` undoes it.
        """
        if delay is not None and not netem_available():
            raise HarnessError(
                f"this kernel has no netem qdisc (sch_netem), so delay={delay!r} cannot be emulated; "
                "shape the rate only (delay=None) or load sch_netem"
            )
        self.unshape_links()
        for host in self.hosts:
            for ns_args, dev in ((["ip", "netns", "exec", host.netns], host.interface), ([], host.root_veth)):
                _run(
                    *ns_args,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "handle",
                    "1:",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    "100ms",
                )
                if delay is not None:
                    _run(
                        *ns_args,
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:1",
                        "handle",
                        "10:",
                        "netem",
                        "delay",
                        delay,
                        "limit",
                        "100000",
                    )

    def unshape_links(self) -> None:
        for host in self.hosts:
            _run("ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", host.interface, "root", check=False)
            _run("tc", "qdisc", "del", "dev", host.root_veth, "root", check=False)

    def link_bytes(self) -> dict[str, int]:
        """Bytes sent + received so far on every host's bridge link (from the root-side veth counters)."""
        out: dict[str, int] = {}
        for host in self.hosts:
            base = f"/sys/class/net/{host.root_veth}/statistics"
            with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
                out[host.netns] = int(rx.read()) + int(tx.read())
        return out

    # --------------------------------------------------------------------------------------------------- Spark
    def _env(self, local_ip: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": spark_home(),
                "SPARK_LOCAL_IP": local_ip,
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_LOG_DIR": self.workdir,
                "SPARK_WORKER_DIR": os.path.join(self.workdir, "work"),
                "SPARK_NO_DAEMONIZE": "1",
            }
        )
        for leak in (
            "SPARK_MASTER_HOST",
            "SPARK_CONF_DIR",
            "PYSPARK_SUBMIT_ARGS",
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
            "TORCHSPARK_LOCAL_IP",
        ):
            env.pop(leak, None)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log_path = os.path.join(self.workdir, f"{name}.log")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self._procs.append(proc)

    def _start_master(self) -> None:
        port, ui = _free_port(self.bridge_ip), _free_port(self.bridge_ip)
        self.master_url = f"spark://{self.bridge_ip}:{port}"
        self.master_ui = f"http://{self.bridge_ip}:{ui}"
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        self._spawn(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.bridge_ip,
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            self._env(self.bridge_ip),
        )

    def _start_worker(self, host: Host) -> None:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        # a new UTS namespace carries the host's own hostname; /etc/netns/<ns>/hosts maps it to 127.0.1.1
        inner = (
            f"hostname {host.hostname} && exec {spark_class} org.apache.spark.deploy.worker.Worker "
            f"--host {host.address} --cores {self.cores} --memory {self.memory} {self.master_url}"
        )
        self._spawn(
            f"worker-{host.index}",
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", inner],
            self._env(host.address),
        )

    def master_state(self) -> dict[str, Any]:
        """The master's JSON status page (``/json/``)."""
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as resp:
            return json.loads(resp.read().decode())  # type: ignore[no-any-return]

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        seen: list[str] = []
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise HarnessError(
                        f"a Spark daemon exited with {proc.returncode} while starting; logs in "
                        f"{self.workdir}:\n{self.log_tail()}"
                    )
            try:
                state = self.master_state()
                seen = sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")
                if len(seen) >= self.workers:
                    return
            except (OSError, ValueError):
                pass  # the master's UI is not up yet
            time.sleep(0.5)
        raise HarnessError(
            f"only {len(seen)} of {self.workers} workers registered with {self.master_url} within "
            f"{self.start_timeout_s:.0f} s (raise start_timeout_s on a loaded machine); logs in "
            f"{self.workdir}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every daemon log (for error messages)."""
        parts = []
        for name in sorted(os.listdir(self.workdir)) if self.workdir and os.path.isdir(self.workdir) else []:
            if name.endswith(".log"):
                with open(os.path.join(self.workdir, name), errors="replace") as f:
                    parts.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(parts)

    def spark_conf(self, **extra: str) -> dict[str, str]:
        """Settings for a driver in the root namespace: this master, the bridge address, one task per core."""
        conf = {
            "spark.master": self.master_url,
            "spark.driver.host": self.bridge_ip,
            "spark.driver.bindAddress": self.bridge_ip,
            "spark.executor.cores": str(self.cores),
            "spark.task.cpus": "1",
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.cores * self.workers),
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.dynamicAllocation.enabled": "false",
            "spark.locality.wait": "0s",
            "spark.ui.enabled": "false",
            # Python workers fork from a daemon that imported torch once (as local_session does)
            "spark.python.daemon.module": "torchspark.spark._daemon",
            "spark.sql.shuffle.partitions": str(self.cores * self.workers),
            # executors must all be up before a barrier stage is scheduled
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(self.start_timeout_s)}s",
        }
        conf.update(extra)
        return conf

    def session(self, app_name: str = "torchspark-netns", **extra: str) -> Any:
        """A SparkSession in this process whose executors run on the namespace hosts (stop it before :meth:`stop`)."""
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(app_name)
        for key, value in self.spark_conf(**extra).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def connect_conf(self, **extra: str) -> dict[str, str]:
        """A Connect server's settings on this cluster: :meth:`spark_conf` without ``spark.master`` (it travels as
        ``--master``) plus a barrier sync timeout (Spark's default, a year, would hide a hung worker)."""
        conf = self.spark_conf(**{"spark.barrier.sync.timeout": "300", **extra})
        conf.pop("spark.master")
        return conf

    def start_connect_server(self, port: int | None = None, timeout_s: float = 180.0, **extra: str) -> ConnectServer:
        """Start a Spark Connect server (``SparkConnectServer`` through pyspark's ``bin/spark-submit``) as this
        cluster's driver: in the root namespace, its gRPC port and its driver on the bridge address, executors
        on the hosts (their ``PYTHONPATH`` is this process's). Clients use ``.url`` (``sc://198.18.X.1:<port>``);
        it is stopped by :meth:`stop` (or its own ``stop()``). Log: ``<workdir>/connect-server.log``.

        Raises:
            SetupError: the server did not listen within ``timeout_s`` (with its log's end).
        """
        from torchspark.spark.connect import start_connect_server

        server = start_connect_server(
            self.master_url,
            port=port,
            host=self.bridge_ip,
            conf=self.connect_conf(**extra),
            timeout_s=timeout_s,
            log_path=os.path.join(self.workdir, "connect-server.log"),
        )
        self._servers.append(server)
        return server

    def run_driver(
        self, argv: Sequence[str], timeout_s: float = 600.0, env: dict[str, str] | None = None, **extra_conf: str
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python argv...`` as a driver in the root namespace (a fresh interpreter: its own SparkContext).

        The script finds its settings as JSON in ``TORCHSPARK_CLUSTER_CONF`` (``json.loads`` it into
        ``SparkSession.builder.config``). Raises :class:`HarnessError` with the output tail on failure.
        """
        run_env = dict(os.environ)
        run_env.update(env or {})
        run_env["TORCHSPARK_CLUSTER_CONF"] = json.dumps(self.spark_conf(**extra_conf))
        run_env["PYSPARK_PYTHON"] = sys.executable
        proc = subprocess.run([sys.executable, *argv], env=run_env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise HarnessError(
                f"driver {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-6000:]}\n--- cluster logs\n{self.log_tail()}"
            )
        return proc

    def exec_in(self, host: Host, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside ``host``'s namespace (with its hostname and /etc/hosts)."""
        inner = f'hostname {host.hostname} && exec "$@"'
        return _run(
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            inner,
            "sh",
            *cmd,
            check=False,
            timeout=timeout,
        )


def _main() -> None:
    """``python benchmarks/cluster_harness.py [workers] [--connect]``: bring a cluster up, print it, tear it down;
    with ``--connect`` also start a Connect server on it and keep everything up until Enter (or EOF)."""
    logging.basicConfig(level=logging.INFO)
    args = [a for a in sys.argv[1:] if a != "--connect"]
    n = int(args[0]) if args else 2
    t0 = time.monotonic()
    with NetnsCluster(workers=n) as cluster:
        print(f"up in {time.monotonic() - t0:.1f} s: {cluster.master_url}")
        for host in cluster.hosts:
            print(host)
        print(json.dumps([(w["host"], w["state"]) for w in cluster.master_state()["workers"]]))
        if "--connect" in sys.argv[1:]:
            server = cluster.start_connect_server()
            print(f"Spark Connect server: {server.url} (log {server.log_path}); press Enter to tear down")
            sys.stdin.readline()
    print("torn down")


if __name__ == "__main__":
    _main()
