"""The straggler benchmark's slowdowns do what they claim: a cgroup CPU quota limits the processes moved into it and
the processes they start later, a host's peer traffic goes through the class whose rate flaps while the driver's
does not, and both are undone. Needs root (and ``ip netns`` / a cgroup cpu controller); skipped otherwise."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

import pytest

from cluster_harness import NetnsCluster, unavailable_reason
from slowdown import CpuQuota, Flapper, PeerLinkShaper, cgroup_unavailable_reason, membership, pids_in_netns

_BUSY = "import sys\nsys.stdout.write('go\\n'); sys.stdout.flush()\nwhile True: pass"


def _needs_cgroup() -> None:
    reason = cgroup_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no CPU quota here: {reason}")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _cpu_share(pid: int, seconds: float) -> float:
    """CPU seconds the process used per wall second over ``seconds``."""
    c0, t0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def _spawn(*argv: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc


def _readline(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The next line the process prints, or AssertionError after ``timeout`` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from {proc.args!r} within {timeout} s"
    return proc.stdout.readline().strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_cpu_quota_limits_a_busy_loop_and_cleanup_removes_the_cgroup() -> None:
    _needs_cgroup()
    busy = _spawn(sys.executable, "-c", _BUSY)
    try:
        assert _readline(busy) == "go"
        quota = CpuQuota(0.1, name=f"torchspark-test-{os.getpid()}")
        with quota:
            assert quota.add([busy.pid]) == 1
            assert quota.contains(busy.pid) and quota.members() == [busy.pid]
            limited = _cpu_share(busy.pid, 1.5)
            throttled = quota.stat().get("nr_throttled", 0)
        free = _cpu_share(busy.pid, 1.5)
    finally:
        _stop(busy)
    # the kernel enforces the quota per 100 ms period: 10% of a CPU, with room for the period edges
    assert limited < 0.1 + 0.08, limited
    assert throttled > 0
    assert free > limited, (free, limited)  # the same loop, once moved out, is not held at 10%
    assert not quota.exists and not os.path.exists(quota.path)


def test_processes_started_inside_inherit_the_quota_and_stop_moves_members_out() -> None:
    _needs_cgroup()
    # a stand-in for the Spark worker daemon: it starts its "executor" only when told to, after being moved
    parent = _spawn(
        sys.executable,
        "-c",
        "import subprocess, sys\nsys.stdin.readline()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\nsys.stdin.readline()\nchild.kill()",
    )
    quota = CpuQuota(0.5, name=f"torchspark-test-tree-{os.getpid()}")
    try:
        with quota:
            quota.add([parent.pid])
            parent.stdin.write("start\n")
            parent.stdin.flush()
            child = int(_readline(parent))
            assert quota.contains(child), open(f"/proc/{child}/cgroup").read()
            assert sorted(quota.members()) == sorted([parent.pid, child])
        # both still run, outside the removed cgroup
        assert not quota.exists
        assert not quota.contains(parent.pid) and not quota.contains(child)
        assert parent.poll() is None
    finally:
        parent.stdin.write("stop\n")
        parent.stdin.flush()
        parent.wait(timeout=10)
        quota.stop()


def test_cpu_quota_refuses_bad_fractions() -> None:
    _needs_cgroup()
    with pytest.raises(ValueError, match="fraction must be in"):
        CpuQuota(0.0)
    with pytest.raises(ValueError, match="period_us"):
        CpuQuota(0.5, period_us=10)


def test_flapper_refuses_bad_ranges() -> None:
    with pytest.raises(ValueError, match="slow_s must be"):
        Flapper(lambda: None, lambda: None, slow_s=(0.5, 0.1))


def _serve(cluster: NetnsCluster, host, port: int, connections: int) -> subprocess.Popen[str]:
    code = (
        f"import socket\ns = socket.create_server(('{host.address}', {port}))\nprint('ready', flush=True)\n"
        f"for _ in range({connections}):\n c, _ = s.accept()\n while c.recv(65536): pass\n c.close()\n"
        " print('received', flush=True)"
    )
    proc = _spawn("ip", "netns", "exec", host.netns, sys.executable, "-c", code)
    assert _readline(proc) == "ready"
    return proc


def _send_from_root(address: str, port: int, size: int) -> None:
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(b"x" * size)


def _send_from(host, address: str, port: int, size: int) -> None:
    code = (
        f"import socket\ns = socket.create_connection(('{address}', {port}), timeout=10)\n"
        f"s.sendall(b'x' * {size}); s.close()"
    )
    subprocess.run(["ip", "netns", "exec", host.netns, sys.executable, "-c", code], check=True, timeout=30)


def test_peer_link_shaper_slows_host_to_host_traffic_only_and_cpu_quota_takes_a_whole_host() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host namespace cluster unavailable: {reason}")
    size = 300_000
    with NetnsCluster(workers=2, with_spark=False) as cluster:
        h1, h2 = cluster.hosts
        shaper = PeerLinkShaper(cluster, h2, base_rate="1gbit", peer_rate="1gbit").start()
        try:
            server = _serve(cluster, h2, 7070, 2)
            try:
                before = shaper.class_bytes()
                _send_from_root(h2.address, 7070, size)  # the driver's side: class 1:20
                assert _readline(server) == "received"  # all of it crossed the link
                after_root = shaper.class_bytes()
                shaper.set_rate("20mbit")
                _send_from(h1, h2.address, 7070, size)  # a peer: class 1:10
                assert _readline(server) == "received"
                after_peer = shaper.class_bytes()
            finally:
                server.wait(timeout=30)
            into_h2 = h2.root_veth  # egress towards host 2 carries the payload
            assert after_root[into_h2]["1:20"] - before[into_h2]["1:20"] >= size
            assert after_root[into_h2]["1:10"] == before[into_h2]["1:10"]
            assert after_peer[into_h2]["1:10"] - after_root[into_h2]["1:10"] >= size
            assert after_peer[into_h2]["1:20"] - after_root[into_h2]["1:20"] < size // 10  # ARP etc. only
            shown = subprocess.run(["tc", "class", "show", "dev", into_h2], capture_output=True, text=True).stdout
            assert "rate 20Mbit" in shown, shown
        finally:
            shaper.stop()
        shown = subprocess.run(["tc", "qdisc", "show", "dev", h2.root_veth], capture_output=True, text=True).stdout
        assert "htb" not in shown

        if cgroup_unavailable_reason() is None:  # the whole host under a quota, as the benchmark does it
            sleeper = subprocess.Popen(["ip", "netns", "exec", h2.netns, "sleep", "60"])
            try:
                deadline = time.monotonic() + 10
                while not pids_in_netns(h2.netns) and time.monotonic() < deadline:
                    time.sleep(0.05)
                with CpuQuota(0.5, name=f"torchspark-test-host-{os.getpid()}") as quota:
                    quota.add(pids_in_netns(h2.netns))
                    seen = membership(quota, h2.netns)
                    assert seen["in"] == ["sleep"] and seen["out"] == [], seen
                    assert membership(quota, h1.netns)["in"] == []
            finally:
                sleeper.kill()
                sleeper.wait(timeout=10)
