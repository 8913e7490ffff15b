"""Slowing one namespace host down: a CPU quota on its processes (cgroup), or a slow / flapping link to its peers.

Used by ``bench_straggler.py`` on a :class:`cluster_harness.NetnsCluster`; needs root.

- :class:`CpuQuota`: a child cgroup of the ``cpu`` controller (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``)
  with a quota of ``fraction`` of one CPU. :meth:`CpuQuota.add` moves processes into it (whole thread groups, via
  ``cgroup.procs``); processes they start later are born in it, so moving a host's Spark worker daemon before a
  driver starts puts that application's executor and its Python workers under the quota too (checked by
  :func:`membership`). :meth:`CpuQuota.stop` moves every member back to the parent cgroup and removes the cgroup.
- :class:`PeerLinkShaper`: replaces a host's ``tc`` root qdisc (both directions of its bridge link) with an htb whose
  class 1:10 carries the traffic between this host and the other hosts (``u32`` filters on their addresses) and
  class 1:20 everything else (driver and master) at ``base_rate``; :meth:`PeerLinkShaper.set_rate` changes the
  peer class's rate on the fly. Only the worker-to-worker traffic (the gradient messages) is slowed, not the
  driver's broadcast of the network or the fit's result.
- :class:`Flapper`: calls ``slow()`` and ``fast()`` in turn on a thread, for seeded random durations: an
  intermittent straggler (a noisy neighbour, a congested link) rather than a constantly slower one.

Everything is undone by ``stop()`` (idempotent; also registered with ``atexit``). This kernel may lack ``netem``
(see ``cluster_harness.netem_available``), so link slowness here is a rate, not an added delay.
"""

from __future__ import annotations

import atexit
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "CpuQuota",
    "PeerLinkShaper",
    "Flapper",
    "cgroup_unavailable_reason",
    "cpu_cgroup_root",
    "pids_in_netns",
    "membership",
]

_MOUNTS = "/proc/mounts"


def cpu_cgroup_root() -> tuple[str, int] | None:
    """``(mount point, version)`` of the hierarchy that has the ``cpu`` controller, or None.

    cgroup v2 (``/sys/fs/cgroup`` of type ``cgroup2``, ``cpu`` in ``cgroup.controllers``) is preferred; otherwise a
    v1 hierarchy mounted with the ``cpu`` option (``/sys/fs/cgroup/cpu`` or ``/sys/fs/cgroup/cpu,cpuacct``).
    """
    try:
        with open(_MOUNTS) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for m in mounts:
        if len(m) >= 4 and m[2] == "cgroup2":
            try:
                with open(os.path.join(m[1], "cgroup.controllers")) as f:
                    if "cpu" in f.read().split():
                        return m[1], 2
            except OSError:
                continue
    for m in mounts:
        if len(m) >= 4 and m[2] == "cgroup" and "cpu" in m[3].split(","):
            return m[1], 1
    return None


def cgroup_unavailable_reason() -> str | None:
    """None when a CPU quota can be set here, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "setting a CPU quota (a child cgroup) needs root"
    found = cpu_cgroup_root()
    if found is None:
        return "no cgroup hierarchy with the cpu controller is mounted (neither v2 with 'cpu' nor v1 'cpu')"
    root, version = found
    probe = os.path.join(root, f"torchspark-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as e:
        return f"cannot create a cgroup under {root} (v{version}): {e}"
    try:
        # a v2 child has cpu.max only once the parent delegates the controller, which CpuQuota does (and undoes)
        if version == 1 and not os.path.exists(os.path.join(probe, "cpu.cfs_quota_us")):
            return f"the cgroup v1 cpu hierarchy at {root} has no cpu.cfs_quota_us (kernel without CFS bandwidth)"
    finally:
        os.rmdir(probe)
    return None


def pids_in_netns(netns: str) -> list[int]:
    """Every process in network namespace ``netns`` (``ip netns pids``)."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class CpuQuota:
    """A child cgroup with a CPU quota of ``fraction`` of one CPU per ``period_us``.

    Args:
        fraction: CPU share, e.g. 0.5 = at most 50 ms of CPU time per 100 ms (over all its processes together).
            None = no limit (the cgroup exists, members are only accounted).
        name: directory name of the cgroup (default ``torchspark-straggler-<pid>``).
        period_us: the enforcement period (100 ms is the kernel's default).
    """

    def __init__(self, fraction: float | None, name: str | None = None, period_us: int = 100_000) -> None:
        if fraction is not None and not 0.01 <= fraction <= 64:
            raise ValueError(f"fraction must be in [0.01, 64] CPUs or None, got {fraction!r}")
        if not 1000 <= period_us <= 1_000_000:
            raise ValueError(f"period_us must be in [1000, 1000000], got {period_us!r}")
        found = cpu_cgroup_root()
        if found is None:
            raise RuntimeError("no cgroup hierarchy with the cpu controller is mounted")
        self.root, self.version = found
        self.name = name or f"torchspark-straggler-{os.getpid()}"
        self.path = os.path.join(self.root, self.name)
        self.fraction = fraction
        self.period_us = period_us
        self._enabled_cpu_in_root = False
        self._started = False

    # ----------------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> CpuQuota:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> CpuQuota:
        if self.version == 2:
            control = os.path.join(self.root, "cgroup.subtree_control")
            with open(control) as f:
                if "cpu" not in f.read().split():
                    self._write(control, "+cpu")
                    self._enabled_cpu_in_root = True
        os.mkdir(self.path)
        self._started = True
        atexit.register(self.stop)
        if self.version == 1:
            self._write(os.path.join(self.path, "cpu.cfs_period_us"), str(self.period_us))
        self.set_fraction(self.fraction)
        return self

    def stop(self) -> None:
        """Move every member back to the parent cgroup and remove this one (idempotent)."""
        if not self._started:
            return
        self._started = False
        parent_procs = os.path.join(self.root, "cgroup.procs")
        for _ in range(50):  # processes may fork while we move them; a few rounds settle it
            members = self.members()
            for pid in members:
                try:
                    self._write(parent_procs, str(pid))
                except OSError:
                    pass  # exited meanwhile
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        if self._enabled_cpu_in_root:
            try:
                self._write(os.path.join(self.root, "cgroup.subtree_control"), "-cpu")
            except OSError:
                pass  # another cgroup started using it meanwhile: leave it enabled
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    @property
    def exists(self) -> bool:
        return os.path.isdir(self.path)

    # -------------------------------------------------------------------------------------------------- control
    def set_fraction(self, fraction: float | None) -> None:
        """Change the quota (None = unlimited) while processes run in it."""
        quota = -1 if fraction is None else max(1000, int(round(fraction * self.period_us)))
        if self.version == 2:
            self._write(os.path.join(self.path, "cpu.max"), f"{'max' if quota < 0 else quota} {self.period_us}")
        else:
            self._write(os.path.join(self.path, "cpu.cfs_quota_us"), str(quota))
        self.fraction = fraction

    def add(self, pids: list[int]) -> int:
        """Move these processes (whole thread groups) into the cgroup; returns how many moved (others had exited)."""
        moved = 0
        for pid in pids:
            try:
                self._write(os.path.join(self.path, "cgroup.procs"), str(pid))
                moved += 1
            except ProcessLookupError:
                continue
            except OSError as e:
                if e.errno == 3:  # ESRCH: gone
                    continue
                raise
        return moved

    def members(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def contains(self, pid: int) -> bool:
        """Whether process ``pid`` is in this cgroup (read from ``/proc/<pid>/cgroup``)."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        for line in lines:
            hier, controllers, path = line.split(":", 2)
            if (self.version == 2 and hier == "0") or (self.version == 1 and "cpu" in controllers.split(",")):
                return path == "/" + self.name
        return False

    def stat(self) -> dict[str, int]:
        """``cpu.stat``: ``nr_periods``, ``nr_throttled`` and the throttled time (v1 ``throttled_time`` in ns,
        v2 ``throttled_usec``); v2 also ``usage_usec``."""
        out: dict[str, int] = {}
        try:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if value.strip().isdigit():
                        out[key] = int(value)
        except OSError:
            pass
        return out

    def throttled_s(self) -> float:
        s = self.stat()
        return s.get("throttled_time", 0) / 1e9 if self.version == 1 else s.get("throttled_usec", 0) / 1e6

    @staticmethod
    def _write(path: str, value: str) -> None:
        with open(path, "w") as f:
            f.write(value)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
        return raw[raw.rfind(")") + 2 :].split()[0]  # R, S, Z (exited, not reaped) ...
    except OSError:
        return "gone"


def membership(quota: CpuQuota, netns: str) -> dict[str, Any]:
    """Which processes of ``netns`` are in ``quota``'s cgroup: ``{"in": [comm...], "out": ["comm (pid, state)"...]}``
    (a process that has exited but is not reaped yet, state Z, may no longer show its cgroup)."""
    pids = pids_in_netns(netns)
    inside = [p for p in pids if quota.contains(p)]
    return {
        "in": sorted(_comm(p) for p in inside),
        "out": sorted(f"{_comm(p)} ({p}, {_state(p)})" for p in pids if p not in inside),
    }


class PeerLinkShaper:
    """htb on both directions of ``host``'s bridge link: its traffic with the other hosts in class 1:10 at a rate
    :meth:`set_rate` can change, everything else (driver, master) in class 1:20 at ``base_rate``.

    Args:
        cluster: a started ``NetnsCluster``.
        host: the host whose link to shape.
        base_rate: the rate of every other flow (the rate the other hosts' links are shaped to).
        peer_rate: the starting rate of the host-to-host class.
    """

    def __init__(self, cluster: Any, host: Any, base_rate: str = "1gbit", peer_rate: str = "1gbit") -> None:
        self.cluster, self.host = cluster, host
        self.base_rate, self.peer_rate = base_rate, peer_rate
        self.peers = [h.address for h in cluster.hosts if h.index != host.index]
        self._started = False
        self._lock = threading.Lock()

    def _devices(self) -> list[tuple[list[str], str, str]]:
        # (command prefix, device, which address field a peer's packet carries on this device's egress)
        return [
            (["ip", "netns", "exec", self.host.netns], self.host.interface, "dst"),
            ([], self.host.root_veth, "src"),
        ]

    @staticmethod
    def _tc(prefix: list[str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*prefix, "tc", *args], capture_output=True, text=True, timeout=15)
        if check and proc.returncode:
            raise RuntimeError(f"tc {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def start(self) -> PeerLinkShaper:
        self._started = True
        atexit.register(self.stop)
        for prefix, dev, field_ in self._devices():
            self._tc(prefix, "qdisc", "del", "dev", dev, "root", check=False)
            self._tc(prefix, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
            self._tc(
                prefix,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                self.peer_rate,
                "ceil",
                self.peer_rate,
            )
            self._tc(
                prefix,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:20",
                "htb",
                "rate",
                self.base_rate,
                "ceil",
                self.base_rate,
            )
            for peer in self.peers:
                self._tc(
                    prefix,
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    "match",
                    "ip",
                    field_,
                    f"{peer}/32",
                    "flowid",
                    "1:10",
                )
        return self

    def set_rate(self, rate: str) -> None:
        """Change the host-to-host rate (both directions)."""
        with self._lock:
            if not self._started:
                return
            for prefix, dev, _ in self._devices():
                self._tc(
                    prefix,
                    "class",
                    "change",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "classid",
                    "1:10",
                    "htb",
                    "rate",
                    rate,
                    "ceil",
                    rate,
                )
            self.peer_rate = rate

    def class_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes sent so far per class and device: ``{dev: {"1:10": n, "1:20": m}}`` (from ``tc -s class show``)."""
        out: dict[str, dict[str, int]] = {}
        for prefix, dev, _ in self._devices():
            text = self._tc(prefix, "-s", "class", "show", "dev", dev).stdout
            current = None
            for line in text.splitlines():
                words = line.split()
                if words[:2] == ["class", "htb"]:
                    current = words[2]
                elif current and words[:1] == ["Sent"]:
                    out.setdefault(dev, {})[current] = int(words[1])
                    current = None
        return out

    def stop(self) -> None:
        """Remove the htb from both devices (the host's link is then unshaped; re-shape it if needed)."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            for prefix, dev, _ in self._devices():
                self._tc(prefix, "qdisc", "del", "dev", dev, "root", check=False)
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001
            pass


class Flapper:
    """Alternates ``slow()`` and ``fast()`` on a daemon thread: slow for a uniform random time in ``slow_s``, fast
    for one in ``fast_s``, and so on (seeded, so two runs see the same pattern); starts fast, ends fast.

    ``timeline`` holds ``(monotonic time, "slow" | "fast")`` switches; :meth:`slow_fraction` is the share of the
    time spent slow.
    """

    def __init__(
        self,
        slow: Callable[[], None],
        fast: Callable[[], None],
        slow_s: tuple[float, float] = (0.2, 0.6),
        fast_s: tuple[float, float] = (0.6, 2.0),
        seed: int = 0,
    ) -> None:
        for name, (lo, hi) in (("slow_s", slow_s), ("fast_s", fast_s)):
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {(lo, hi)!r}")
        self._slow, self._fast = slow, fast
        self.slow_s, self.fast_s = slow_s, fast_s
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flapper", daemon=True)
        self.timeline: list[tuple[float, str]] = []
        self.errors: list[str] = []

    def _run(self) -> None:
        while not self._stop.wait(self._rng.uniform(*self.fast_s)):
            self._switch(self._slow, "slow")
            if self._stop.wait(self._rng.uniform(*self.slow_s)):
                break
            self._switch(self._fast, "fast")

    def _switch(self, action: Callable[[], None], state: str) -> None:
        try:
            action()
            self.timeline.append((time.monotonic(), state))
        except Exception as e:  # noqa: BLE001 - keep flapping; the caller reports the errors
            self.errors.append(f"{state}: {e}")

    def start(self) -> Flapper:
        self.timeline.append((time.monotonic(), "fast"))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._switch(self._fast, "fast")

    def slow_fraction(self) -> float:
        if len(self.timeline) < 2:
            return 0.0
        slow = sum(b[0] - a[0] for a, b in zip(self.timeline, self.timeline[1:]) if a[1] == "slow")
        return slow / (self.timeline[-1][0] - self.timeline[0][0])
