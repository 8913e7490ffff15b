"""port_range: validated on the mesh options and on both masters; listeners open inside the range only."""

from __future__ import annotations

import socket

import pytest

from torchspark.errors import ConfigError, SetupError
from torchspark.training import MeshConfig, ParameterAveragingTrainingMaster, SharedTrainingMaster, master_from_json
from torchspark.training.rendezvous.ports import listen_in_range


@pytest.mark.parametrize("bad", [(0, 10), (100, 99), (1, 70000), (1,), "40000-40100", (1.0, 2.0), (True, 5)])
def test_bad_port_range_is_refused_with_an_example(bad) -> None:
    with pytest.raises(ConfigError, match=r"port_range must be \(first, last\).*\(40000, 40100\)"):
        MeshConfig(port_range=bad)


def test_port_and_port_range_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="port .*or port_range.*not both"):
        SharedTrainingMaster(port=40000, port_range=(40000, 40100))


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
def test_port_range_reaches_the_mesh_and_round_trips_through_json(cls) -> None:
    master = cls(port_range=(40000, 40100))
    assert master.mesh.port_range == (40000, 40100)
    again = master_from_json(master.to_json())
    assert again == master and again.mesh.port_range == (40000, 40100)


def _listener(port: int) -> socket.socket:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    s.listen()
    return s


def _free_block(n: int) -> int:
    """A first port p such that p..p+n-1 are free right now."""
    for first in range(41000, 60000, 50):
        try:
            held = [_listener(first + i) for i in range(n)]
        except OSError:
            continue
        for s in held:
            s.close()
        return first
    raise RuntimeError("no free block of ports")


def test_listeners_open_inside_the_range_and_skip_taken_ports() -> None:
    first = _free_block(3)
    taken = [_listener(first), _listener(first + 2)]
    try:
        got = listen_in_range(_listener, (first, first + 2), "test listener")
        assert got.getsockname()[1] == first + 1  # the only free one
        with pytest.raises(SetupError, match=rf"test listener: no free port in port_range=\({first}, {first + 2}\)"):
            listen_in_range(_listener, (first, first + 2), "test listener")
        got.close()
    finally:
        for s in taken:
            s.close()


def test_without_a_range_the_given_port_is_used() -> None:
    s = listen_in_range(_listener, None, "x")
    assert s.getsockname()[1] > 0  # 0: any free port
    s.close()
